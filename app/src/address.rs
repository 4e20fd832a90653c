//! Addresses as the console writes them: the pages their own (a search kept in the query), the server its
//! sign-in redirects. Its own module, below the pages and the routes both.

/// `path` with the `params` that hold a value, in order, as its query: `/nodes?q=h200&page=2`; `path` alone
/// where none does.
pub fn with_query(path: &str, params: &[(&str, String)]) -> String {
    let query: Vec<String> = params
        .iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| format!("{key}={}", query_value(value)))
        .collect();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}

/// `text` as a value in an address's query: what a path may keep as it is, the rest written `%XX`.
pub fn query_value(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
