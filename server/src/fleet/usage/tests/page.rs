//! The console's Usage page against the CSV of the same period.

use super::{at, held};
use crate::testing::{TestApp, MAJIN};
use axum::http::StatusCode;
use placement::usage::HOUR_MS;

/// The cells of the Usage page's table, row by row, as the page renders them.
fn page_rows(html: &str) -> Vec<Vec<String>> {
    let table = &html[html
        .find(r#"data-testid="usage-table""#)
        .expect("the usage table")..];
    let table = &table[..table.find("</table>").unwrap()];
    let body = &table[table.find("<tbody>").unwrap()..];
    body.split("<tr>")
        .skip(1)
        .map(|row| {
            let parts: Vec<&str> = row.split(['<', '>']).collect();
            parts
                .windows(2)
                .filter(|w| w[0].starts_with("th") || w[0].starts_with("td"))
                .map(|w| w[1].replace('—', ""))
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn the_usage_page_shows_what_the_csv_says() {
    let app = TestApp::new(MAJIN).await;
    let now = crate::fleet::usage::now_ms();
    held(
        &app,
        "listen",
        "majin",
        0,
        2,
        8,
        (now - 3 * HOUR_MS, now - 2 * HOUR_MS),
    )
    .await;
    held(
        &app,
        "voice",
        "majin",
        0,
        4,
        8,
        (now - 2 * HOUR_MS, now - HOUR_MS),
    )
    .await;
    let (status, page) = app.get("/usage?period=24h&by=worker").await;
    assert_eq!(status, StatusCode::OK);
    let rows = page_rows(page.as_str().unwrap());
    let (_, csv) = app
        .get(&format!(
            "/api/usage.csv?from={}&to={}&by=worker",
            at(now - 24 * HOUR_MS),
            at(now)
        ))
        .await;
    let csv: Vec<Vec<String>> = csv
        .as_str()
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["voice", "0.5", "", ""],
            ["listen", "0.25", "", ""],
            ["Total", "0.75", "", ""]
        ]
    );
    assert_eq!(rows, csv);
}
