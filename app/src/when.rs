//! Times as the console shows them: short and in UTC (`6 Dec 2026, 16:55 UTC`), the exact instant on
//! hover. Worked out from the text alone, so the server's page and the browser's agree to the letter.

use leptos::prelude::*;

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `2026-12-06T16:55:12.123Z` (or with a space, or an offset) as `6 Dec 2026, 16:55 UTC`; text that is no
/// such time, as it is.
pub fn human(at: &str) -> String {
    let parts = (|| {
        let year = at.get(0..4)?.parse::<u32>().ok()?;
        let month = at.get(5..7)?.parse::<usize>().ok()?;
        let day = at.get(8..10)?.parse::<u32>().ok()?;
        let clock = at.get(11..16)?;
        let separators = (at.get(4..5)?, at.get(7..8)?, at.get(13..14)?);
        (separators == ("-", "-", ":") && (1..=12).contains(&month))
            .then(|| format!("{day} {} {year}, {clock} UTC", MONTHS[month - 1]))
    })();
    parts.unwrap_or_else(|| at.to_owned())
}

/// A time, short, with the exact one on hover and for machines.
#[component]
pub fn When(
    /// The time as stored (RFC 3339).
    #[prop(into)]
    at: String,
) -> impl IntoView {
    view! { <time datetime=at.clone() title=at.clone()>{human(&at)}</time> }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_reads_short_in_utc_and_anything_else_as_it_is() {
        assert_eq!(human("2026-12-06T16:55:12.123Z"), "6 Dec 2026, 16:55 UTC");
        assert_eq!(human("2026-01-09 08:05:00"), "9 Jan 2026, 08:05 UTC");
        assert_eq!(human("never"), "never");
        assert_eq!(human("2026-13-01T00:00:00Z"), "2026-13-01T00:00:00Z");
    }
}
