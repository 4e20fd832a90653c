//! The console's site (wasm, JS, CSS, images) served from inside the binary, so that `tessera` alone is the
//! whole console: built with the `embed-site` feature from `target/embed-site`, the copy of `target/site`
//! that `scripts/package` takes once `cargo leptos build` has written it whole. `LEPTOS_SITE_ROOT` in the environment still serves the site from that
//! folder instead, as `cargo leptos serve` and `watch` set it.
//!
//! Each file is served with its content type and an `ETag` (its SHA-256) that a browser revalidates with
//! (`no-cache`: the files' names carry no hash, so a new build under the same name must be fetched). Where
//! the package step left a gzip copy beside a file (`tessera.wasm.gz`) and the browser takes gzip, that is
//! served instead, `Content-Encoding: gzip`.

use axum::body::Body;
use axum::http::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_TYPE, ETAG, IF_NONE_MATCH, VARY,
};
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, Uri};

/// The files built into this binary.
#[cfg(feature = "embed-site")]
#[derive(rust_embed::Embed)]
#[folder = "../target/embed-site"]
struct Site;

/// One embedded file: its bytes, content type and hash.
struct File {
    bytes: std::borrow::Cow<'static, [u8]>,
    mime: String,
    sha256: [u8; 32],
}

#[cfg(feature = "embed-site")]
fn file(path: &str) -> Option<File> {
    Site::get(path).map(|f| File {
        mime: f.metadata.mimetype().to_owned(),
        sha256: f.metadata.sha256_hash(),
        bytes: f.data,
    })
}

#[cfg(not(feature = "embed-site"))]
fn file(_path: &str) -> Option<File> {
    None
}

/// Whether the site is served from inside the binary: it was built in, and no `LEPTOS_SITE_ROOT` asks for
/// a folder instead.
pub fn embedded() -> bool {
    cfg!(feature = "embed-site") && std::env::var_os("LEPTOS_SITE_ROOT").is_none()
}

/// The answer for `uri` from the embedded site, if it holds that file.
pub fn serve(uri: &Uri, headers: &HeaderMap) -> Option<Response<Body>> {
    if !embedded() {
        return None;
    }
    let path = uri.path().trim_start_matches('/');
    if path.is_empty() || path.ends_with(".gz") {
        return None;
    }
    let plain = file(path)?;
    let gzip = takes_gzip(headers)
        .then(|| file(&format!("{path}.gz")))
        .flatten();
    Some(answer(&plain, gzip.as_ref(), headers))
}

/// Whether the request's `Accept-Encoding` takes gzip.
fn takes_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.trim().split(';');
            let name = parts.next().unwrap_or_default().trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

fn answer(plain: &File, gzip: Option<&File>, headers: &HeaderMap) -> Response<Body> {
    let body = gzip.unwrap_or(plain);
    let etag = format!(
        "\"{}{}\"",
        hex(&body.sha256),
        if gzip.is_some() { "-gzip" } else { "" }
    );
    let mut response = if headers
        .get(IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|tags| tags.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
    {
        Response::builder()
            .status(StatusCode::NOT_MODIFIED)
            .body(Body::empty())
    } else {
        Response::builder()
            .header(CONTENT_TYPE, plain.mime.as_str())
            .body(Body::from(body.bytes.clone().into_owned()))
    }
    .expect("a response of known headers");
    let h = response.headers_mut();
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(VARY, HeaderValue::from_static("accept-encoding"));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        h.insert(ETAG, value);
    }
    if gzip.is_some() {
        h.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    response
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(bytes: &'static [u8], mime: &str) -> File {
        use sha2::Digest;
        File {
            bytes: std::borrow::Cow::Borrowed(bytes),
            mime: mime.to_owned(),
            sha256: sha2::Sha256::digest(bytes).into(),
        }
    }

    fn headers(pairs: &[(axum::http::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        h
    }

    #[test]
    fn gzip_is_taken_where_the_browser_accepts_it_and_not_where_it_refuses_it() {
        assert!(takes_gzip(&headers(&[(
            ACCEPT_ENCODING,
            "gzip, deflate, br"
        )])));
        assert!(takes_gzip(&headers(&[(
            ACCEPT_ENCODING,
            "br;q=1.0, gzip;q=0.8"
        )])));
        assert!(!takes_gzip(&headers(&[(ACCEPT_ENCODING, "br, gzip;q=0")])));
        assert!(!takes_gzip(&headers(&[(ACCEPT_ENCODING, "identity")])));
        assert!(!takes_gzip(&HeaderMap::new()));
    }

    #[test]
    fn a_file_is_served_with_its_type_and_etag_gzip_where_taken_and_304_when_the_browser_has_it() {
        let wasm = file(b"\0asm plain", "application/wasm");
        let gz = file(b"\x1f\x8b compressed", "application/gzip");
        let plain = answer(&wasm, None, &HeaderMap::new());
        assert_eq!(plain.status(), StatusCode::OK);
        assert_eq!(plain.headers()[CONTENT_TYPE], "application/wasm");
        assert_eq!(plain.headers()[CACHE_CONTROL], "no-cache");
        assert!(plain.headers().get(CONTENT_ENCODING).is_none());
        let tag = plain.headers()[ETAG].to_str().unwrap().to_owned();
        assert_eq!(tag.len(), 66, "{tag}");

        let zipped = answer(&wasm, Some(&gz), &HeaderMap::new());
        assert_eq!(
            zipped.headers()[CONTENT_TYPE],
            "application/wasm",
            "the file's own type"
        );
        assert_eq!(zipped.headers()[CONTENT_ENCODING], "gzip");
        assert_ne!(zipped.headers()[ETAG], tag.as_str());

        let again = answer(&wasm, None, &headers(&[(IF_NONE_MATCH, &tag)]));
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let other = answer(&wasm, None, &headers(&[(IF_NONE_MATCH, "\"old\"")]));
        assert_eq!(other.status(), StatusCode::OK);
    }

    #[test]
    #[cfg(not(feature = "embed-site"))]
    fn without_the_feature_nothing_is_served_from_inside() {
        assert!(!embedded());
        assert!(serve(&Uri::from_static("/pkg/tessera.js"), &HeaderMap::new()).is_none());
    }
}
