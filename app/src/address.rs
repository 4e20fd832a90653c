//! Addresses as the console writes them: the pages their own (a search kept in the query), the server its
//! sign-in redirects. Its own module, below the pages and the routes both.

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
