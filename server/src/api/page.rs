//! Pages of the REST API's lists (issue 29): `?limit=N` (1 to 1000, 1000 unless said) and the opaque
//! `?cursor=` the previous page's `Link: <…>; rel="next"` header gives, so that a fleet of 40,000 workers
//! is read in pages and a script follows `next` until there is none. The body stays the list itself, as
//! before, and `X-Total-Count` says how many match in all.
//!
//! A cursor names the last item of its page, not a position: an item added or removed meanwhile shifts
//! nothing, and the next page goes on after that item wherever it is now. Where it was removed, the next
//! page is empty rather than a repeat, so that no item is read twice.

use crate::error::ApiError;
use axum::http::{header, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

/// The most items one page holds, and how many it holds unless told.
pub const MAX_LIMIT: usize = 1000;

/// What marks a cursor as this API's, so that a made-up one is refused with words, not misread.
const CURSOR_PREFIX: &str = "c1.";

/// `?limit=&cursor=`, as typed.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct PageQuery {
    /// How many items, 1 to [`MAX_LIMIT`].
    pub limit: Option<String>,
    /// Where the last page ended.
    pub cursor: Option<String>,
}

/// A page as asked for: how many, and after which item.
struct Asked {
    limit: usize,
    after: Option<String>,
}

impl PageQuery {
    fn parse(&self) -> Result<Asked, ApiError> {
        let limit = match self.limit.as_deref() {
            None => MAX_LIMIT,
            Some(text) => text
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))
                .ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "limit must be a whole number from 1 to {MAX_LIMIT}, not {text:?}"
                    ))
                })?,
        };
        let after = self.cursor.as_deref().map(decode).transpose()?;
        Ok(Asked { limit, after })
    }
}

fn encode(key: &str) -> String {
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{CURSOR_PREFIX}{hex}")
}

fn decode(cursor: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::BadRequest(
            "cursor is not one this API gave: follow the Link header's next, or leave cursor out for the first page"
                .to_owned(),
        )
    };
    let hex = cursor.strip_prefix(CURSOR_PREFIX).ok_or_else(bad)?;
    if hex.len() % 2 != 0 {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// The page of `items` (in the list's own order, each named by `key`) that `query` asks for, answered
/// with the `Link` to the next page where there is one and `X-Total-Count`. `uri` is the request's, whose
/// other parameters (the filters) the next page keeps.
pub fn page<T: Serialize>(
    items: Vec<T>,
    key: impl Fn(&T) -> String,
    query: &PageQuery,
    uri: &Uri,
) -> Result<Response, ApiError> {
    let asked = query.parse()?;
    let total = items.len();
    let start = match &asked.after {
        None => 0,
        Some(after) => items
            .iter()
            .position(|item| key(item) == *after)
            .map_or(total, |i| i + 1),
    };
    let mut rest: Vec<T> = items.into_iter().skip(start).collect();
    let more = rest.len() > asked.limit;
    rest.truncate(asked.limit);
    let next = more
        .then(|| {
            rest.last()
                .map(|last| next_link(uri, &encode(&key(last)), asked.limit))
        })
        .flatten();
    let mut response = Json(rest).into_response();
    let headers = response.headers_mut();
    if let Some(link) = next.and_then(|l| HeaderValue::from_str(&l).ok()) {
        headers.insert(header::LINK, link);
    }
    headers.insert("x-total-count", HeaderValue::from(total));
    Ok(response)
}

/// `<path?…&limit=N&cursor=C>; rel="next"`: the request's own parameters, its page's replaced.
fn next_link(uri: &Uri, cursor: &str, limit: usize) -> String {
    let kept: Vec<&str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            !pair.is_empty() && name != "cursor" && name != "limit"
        })
        .collect();
    let mut query = kept.join("&");
    if !query.is_empty() {
        query.push('&');
    }
    format!(
        "<{}?{query}limit={limit}&cursor={cursor}>; rel=\"next\"",
        uri.path()
    )
}

/// The query of a list, or a 400 that names the parameter it does not take and those it does.
pub fn query<T>(
    query: Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, ApiError> {
    query
        .map(|axum::extract::Query(q)| q)
        .map_err(|e| ApiError::BadRequest(e.body_text()))
}

/// Whether `value` passes the filter `wanted`, where one is given.
pub fn matches(wanted: Option<&str>, value: Option<&str>) -> bool {
    wanted.is_none_or(|w| value == Some(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("w{i}")).collect()
    }

    async fn read(response: Response) -> (Vec<String>, Option<String>, String) {
        let link = response
            .headers()
            .get(header::LINK)
            .map(|v| v.to_str().unwrap().to_owned());
        let total = response.headers()["x-total-count"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (serde_json::from_slice(&body).unwrap(), link, total)
    }

    fn query(limit: Option<&str>, cursor: Option<&str>) -> PageQuery {
        PageQuery {
            limit: limit.map(str::to_owned),
            cursor: cursor.map(str::to_owned),
        }
    }

    /// The cursor of a `Link` header's next page.
    fn cursor_of(link: &str) -> String {
        link.split("cursor=")
            .nth(1)
            .unwrap()
            .split('>')
            .next()
            .unwrap()
            .to_owned()
    }

    #[tokio::test]
    async fn following_next_reads_every_item_once_in_order_keeping_the_filters() {
        let uri: Uri = "/api/workers?machine=atlas&limit=2".parse().unwrap();
        let all = names(5);
        let (first, link, total) =
            read(page(all.clone(), |s| s.clone(), &query(Some("2"), None), &uri).unwrap()).await;
        assert_eq!(
            (first, total.as_str()),
            (vec!["w0".to_owned(), "w1".to_owned()], "5")
        );
        let link = link.unwrap();
        assert!(
            link.starts_with("</api/workers?machine=atlas&limit=2&cursor=c1."),
            "{link}"
        );
        assert!(link.ends_with(">; rel=\"next\""), "{link}");
        let (second, link, _) = read(
            page(
                all.clone(),
                |s| s.clone(),
                &query(Some("2"), Some(&cursor_of(&link.clone()))),
                &uri,
            )
            .unwrap(),
        )
        .await;
        assert_eq!(second, ["w2", "w3"]);
        let (third, link, _) = read(
            page(
                all,
                |s| s.clone(),
                &query(Some("2"), Some(&cursor_of(&link.unwrap()))),
                &uri,
            )
            .unwrap(),
        )
        .await;
        assert_eq!(
            (third, link),
            (vec!["w4".to_owned()], None),
            "the last page has no next"
        );
    }

    #[tokio::test]
    async fn an_item_added_or_removed_between_pages_shifts_nothing_and_nothing_is_read_twice() {
        let uri: Uri = "/api/workers".parse().unwrap();
        let (_, link, _) =
            read(page(names(4), |s| s.clone(), &query(Some("2"), None), &uri).unwrap()).await;
        let cursor = cursor_of(&link.unwrap());
        // w0 removed and w9 added meanwhile: the next page goes on after w1 all the same.
        let now: Vec<String> = ["w1", "w2", "w3", "w9"].map(str::to_owned).to_vec();
        let (second, _, _) =
            read(page(now, |s| s.clone(), &query(Some("2"), Some(&cursor)), &uri).unwrap()).await;
        assert_eq!(second, ["w2", "w3"]);
        // w1 itself removed: an empty page, not the first again.
        let gone: Vec<String> = ["w2", "w3"].map(str::to_owned).to_vec();
        let (after_gone, _, _) =
            read(page(gone, |s| s.clone(), &query(Some("2"), Some(&cursor)), &uri).unwrap()).await;
        assert!(after_gone.is_empty());
    }

    #[test]
    fn a_bad_limit_or_a_made_up_cursor_is_refused_with_what_to_send() {
        let uri: Uri = "/api/workers".parse().unwrap();
        for limit in ["0", "1001", "ten", "-1"] {
            let err = page(names(1), |s| s.clone(), &query(Some(limit), None), &uri).unwrap_err();
            assert!(
                err.to_string()
                    .contains("limit must be a whole number from 1 to 1000"),
                "{err}"
            );
        }
        for cursor in ["w1", "c1.zz", "c1.abc", "c1.ff"] {
            let err = page(names(1), |s| s.clone(), &query(None, Some(cursor)), &uri).unwrap_err();
            assert!(
                err.to_string()
                    .starts_with("cursor is not one this API gave"),
                "{cursor}: {err}"
            );
        }
        assert_eq!(
            decode(&encode("group:g/m@atlas")).unwrap(),
            "group:g/m@atlas"
        );
    }
}
