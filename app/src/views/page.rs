//! One page of a long table (the Nodes and Models tabs): its rows, and where it is among the pages of the
//! rows that match a search, so that a tab stays quick with thousands of rows.

use serde::{Deserialize, Serialize};

/// Rows a page shows.
pub const PER_PAGE: usize = 50;

/// One page of rows, and where it is among the pages of those that match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The rows of this page.
    pub rows: Vec<T>,
    /// Rows that match the search, on all pages.
    pub matching: usize,
    /// Every row.
    pub all: usize,
    /// This page, from 1.
    pub page: usize,
    /// Pages of rows that match.
    pub pages: usize,
}

impl<T> Page<T> {
    /// Page `page` (from 1; past the last is the last) of the `rows` that `matches` keeps, in their order.
    pub fn of(rows: Vec<T>, matches: impl Fn(&T) -> bool, page: usize) -> Page<T> {
        let all = rows.len();
        let matching: Vec<T> = rows.into_iter().filter(|row| matches(row)).collect();
        let pages = matching.len().div_ceil(PER_PAGE).max(1);
        let page = page.clamp(1, pages);
        Page {
            matching: matching.len(),
            all,
            page,
            pages,
            rows: matching
                .into_iter()
                .skip((page - 1) * PER_PAGE)
                .take(PER_PAGE)
                .collect(),
        }
    }

    /// Which rows the page shows, of how many, named `one` or `many`: "nodes 51–100 of 1254", "node 1 of
    /// 1 matching, of 1254".
    pub fn shown_text(&self, one: &str, many: &str) -> String {
        let first = (self.page.max(1) - 1) * PER_PAGE + 1;
        let which = match self.rows.len() {
            0 => format!("no {many}"),
            1 => format!("{one} {first}"),
            n => format!("{many} {first}–{}", first + n - 1),
        };
        if self.matching == self.all {
            format!("{which} of {}", self.all)
        } else {
            format!("{which} of {} matching, of {}", self.matching, self.all)
        }
    }
}

/// Whether `text` holds `needle`, a search as typed: any case, spaces around it ignored.
pub fn holds(text: &str, needle: &str) -> bool {
    text.to_lowercase().contains(&needle.trim().to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_past_the_last_is_the_last_and_says_which_rows_it_shows() {
        let rows: Vec<u32> = (1..=120).collect();
        let last = Page::of(rows.clone(), |_| true, 9);
        assert_eq!((last.page, last.pages, last.rows.len()), (3, 3, 20));
        assert_eq!(last.shown_text("row", "rows"), "rows 101–120 of 120");
        let odd = Page::of(rows.clone(), |r| r % 2 == 1, 1);
        assert_eq!(
            odd.shown_text("row", "rows"),
            "rows 1–50 of 60 matching, of 120"
        );
        let one = Page::of(rows.clone(), |r| *r == 7, 1);
        assert_eq!(one.shown_text("row", "rows"), "row 1 of 1 matching, of 120");
        let none = Page::of(rows, |_| false, 3);
        assert_eq!((none.page, none.pages), (1, 1));
    }
}
