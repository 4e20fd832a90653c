//! The Usage page: GPU-hours, use and energy over a period, split among the sharers of each GPU by their
//! share of its memory (seed 000), as a table and a chart rendered on the server, with the same report as
//! CSV.

use crate::error::AppError;
use crate::pages::overview::thousands;
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::hooks::use_query_map;
use placement::usage::HOUR_MS;
use placement::{Grouping, UsageReport, UsageRow};

/// The periods the picker offers: query value, label, length.
pub const PERIODS: [(&str, &str, u64); 4] = [
    ("24h", "Last 24 hours", 24 * HOUR_MS),
    ("7d", "Last 7 days", 7 * 24 * HOUR_MS),
    ("30d", "Last 30 days", 30 * 24 * HOUR_MS),
    ("90d", "Last 90 days", 90 * 24 * HOUR_MS),
];

/// The usage report for the period ending now.
#[server(prefix = "/rpc", endpoint = "load_usage", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_usage(period: String, by: String) -> Result<UsageReport, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    let length = PERIODS
        .iter()
        .find(|(name, _, _)| *name == period)
        .map(|(_, _, length)| *length)
        .ok_or_else(|| {
            AppError::BadRequest(format!(
                "no period named {period:?}: use 24h, 7d, 30d or 90d"
            ))
        })?;
    let by = Grouping::parse(&by).ok_or_else(|| {
        AppError::BadRequest(format!(
            "cannot add up by {by:?}: use machine, group, model or worker"
        ))
    })?;
    let to = console.now_ms();
    // From a whole hour: readings older than a week are kept as hourly runs, whose figures are exact
    // for whole hours only (docs/src/operations.md, "Retention").
    let from = to.saturating_sub(length) / HOUR_MS * HOUR_MS;
    crate::services::answer(console.usage(from, to, by)).await
}

fn grouping_label(by: Grouping) -> &'static str {
    match by {
        Grouping::Machine => "Machine",
        Grouping::Group => "Group",
        Grouping::Model => "Model",
        Grouping::Worker => "Worker",
    }
}

/// The page.
#[component]
pub fn UsagePage() -> impl IntoView {
    let query = use_query_map();
    let period = move || {
        query
            .read()
            .get("period")
            .filter(|p| PERIODS.iter().any(|(name, _, _)| name == p))
            .unwrap_or_else(|| "24h".to_owned())
    };
    let by = move || {
        query
            .read()
            .get("by")
            .and_then(|b| Grouping::parse(&b))
            .unwrap_or_default()
    };
    let report = Resource::new(
        move || (period(), by()),
        |(period, by)| load_usage(period, by.as_str().to_owned()),
    );
    view! {
        <div class="page">
            <h1>"Usage"</h1>
            <p class="lede">
                "A shared GPU counts for each sharer by its share of the GPU's memory: 2 GB of an 8 GB GPU for an hour is a quarter of a GPU-hour, with a quarter of the GPU's use and energy."
            </p>
            <form class="period-picker" method="get" action="/usage">
                <label for="period">"Period"</label>
                <select id="period" name="period">
                    {PERIODS
                        .iter()
                        .map(|(name, label, _)| {
                            view! { <option value=*name selected=move || period() == *name>{*label}</option> }
                        })
                        .collect_view()}
                </select>
                <label for="by">"By"</label>
                <select id="by" name="by">
                    {Grouping::ALL
                        .iter()
                        .map(|g| {
                            let g = *g;
                            view! { <option value=g.as_str() selected=move || by() == g>{grouping_label(g)}</option> }
                        })
                        .collect_view()}
                </select>
                <button type="submit">"Show"</button>
            </form>
            <Suspense fallback=|| view! { <p>"Adding up…"</p> }>
                {move || report.get().map(|answer| match answer {
                    Ok(report) => view! { <Report report /> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Suspense>
        </div>
    }
}

/// The table, the chart and the CSV link of one report.
#[component]
fn Report(report: UsageReport) -> impl IntoView {
    let csv = format!(
        "/api/usage.csv?from={}&to={}&by={}",
        rfc3339(report.from_ms),
        // Up to the next whole second, so that the CSV covers all of the page's period.
        rfc3339(report.to_ms.div_ceil(1000) * 1000),
        report.by.as_str()
    );
    let requests = view! { <Requests report=report.clone() /> };
    if report.rows.is_empty() {
        return view! {
            <p data-testid="no-usage">"No GPU memory was held in this period."</p>
            <a href=csv download>"Download CSV"</a>
            {requests}
        }
        .into_any();
    }
    let heading = grouping_label(report.by);
    view! {
        <Chart rows=report.rows.clone() total=report.total.clone() />
        <table class="usage" data-testid="usage-table">
            <caption>"From " {rfc3339(report.from_ms)} " to " {rfc3339(report.to_ms)}</caption>
            <thead>
                <tr>
                    <th scope="col">{heading}</th>
                    <th scope="col" class="number">"GPU-hours"</th>
                    <th scope="col" class="number">"Busy GPU-hours"</th>
                    <th scope="col" class="number">"Energy (Wh)"</th>
                </tr>
            </thead>
            <tbody>
                {report.rows.iter().map(row).collect_view()}
            </tbody>
            <tfoot>{row(&report.total)}</tfoot>
        </table>
        <p class="note">
            "Busy GPU-hours weigh each share by the GPU's utilisation; they and the energy come from NVML's readings, so a GPU without readings shows —."
        </p>
        <a href=csv download data-testid="usage-csv">"Download CSV"</a>
        {requests}
    }
    .into_any()
}

/// What went through the gateway over the report's period, per model and API token.
#[component]
fn Requests(report: UsageReport) -> impl IntoView {
    let csv = format!(
        "/api/usage/requests.csv?from={}&to={}",
        rfc3339(report.from_ms),
        rfc3339(report.to_ms.div_ceil(1000) * 1000),
    );
    let body = if report.requests.is_empty() {
        view! { <p data-testid="no-requests">"No request went through the gateway in this period."</p> }.into_any()
    } else {
        view! {
            <table class="usage" data-testid="requests-table">
                <thead>
                    <tr>
                        <th scope="col">"Model"</th>
                        <th scope="col">"API token"</th>
                        <th scope="col" class="number">"Requests"</th>
                        <th scope="col" class="number">"Failed"</th>
                        <th scope="col" class="number">"Prompt tokens"</th>
                        <th scope="col" class="number">"Completion tokens"</th>
                    </tr>
                </thead>
                <tbody>
                    {report.requests.into_iter().map(|r| view! {
                        <tr>
                            <th scope="row">{r.model}</th>
                            <td>{r.key}</td>
                            <td class="number">{thousands(r.requests)}</td>
                            <td class="number">{thousands(r.failed)}</td>
                            <td class="number">{thousands(r.prompt_tokens)}</td>
                            <td class="number">{thousands(r.completion_tokens)}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
            <p class="note">
                "Counted by the hour each request came in; the tokens are those the engines reported in their answers' usage (a streamed answer reports them when the request asks for stream_options.include_usage)."
            </p>
        }.into_any()
    };
    view! {
        <h2 id="requests">"Requests through the gateway"</h2>
        {body}
        <a href=csv download data-testid="requests-csv">"Download the requests as CSV"</a>
    }
}

fn row(r: &UsageRow) -> impl IntoView {
    view! {
        <tr>
            <th scope="row">{r.name.clone()}</th>
            <td class="number">{r.gpu_hours()}</td>
            <td class="number">{r.busy_gpu_hours()}</td>
            <td class="number">{r.energy_wh()}</td>
        </tr>
    }
}

/// GPU-hours per row as horizontal bars, each stacked (the busy GPU-hours, where readings say, then the
/// rest), labelled with their unit, then the total: drawn as SVG on the server.
#[component]
fn Chart(rows: Vec<UsageRow>, total: UsageRow) -> impl IntoView {
    const BAR: u64 = 22;
    const LABEL: u64 = 160;
    const WIDTH: u64 = 720;
    const ROOM: u64 = WIDTH - LABEL - 200;
    let most = rows
        .iter()
        .map(|r| r.figures.gpu_time.0)
        .max()
        .unwrap_or(0)
        .max(1);
    let height = BAR * (rows.len() as u64 + 1) + 8;
    let summary = rows
        .iter()
        .map(|r| format!("{} {} GPU-hours", r.name, r.gpu_hours()))
        .collect::<Vec<_>>()
        .join(", ");
    let label = |r: &UsageRow| match r.figures.busy {
        Some(_) => format!("{} GPU-h ({} busy)", r.gpu_hours(), r.busy_gpu_hours()),
        None => format!("{} GPU-h", r.gpu_hours()),
    };
    let bars = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let y = i as u64 * BAR + 2;
            let width = (ROOM * r.figures.gpu_time.0 / most).max(1);
            let busy = r
                .figures
                .busy
                .map_or(0, |b| ROOM * b.0.min(r.figures.gpu_time.0) / most);
            view! {
                <g>
                    <text x=LABEL - 8 y=y + 15 text-anchor="end">{r.name.clone()}</text>
                    <rect class="idle" x=LABEL y=y width=width height=BAR - 6 rx="3"></rect>
                    <rect class="busy" x=LABEL y=y width=busy height=BAR - 6 rx="3"></rect>
                    <text x=LABEL + width + 6 y=y + 15>{label(r)}</text>
                </g>
            }
        })
        .collect_view();
    let y = rows.len() as u64 * BAR + 6;
    view! {
        <svg
            class="usage-chart"
            viewBox=format!("0 0 {WIDTH} {height}")
            role="img"
            aria-label=format!("GPU-hours: {summary}; in all {} GPU-hours", total.gpu_hours())
            data-testid="usage-chart"
        >
            {bars}
            <line class="total-rule" x1=LABEL x2=WIDTH - 10 y1=y - 3 y2=y - 3></line>
            <text x=LABEL - 8 y=y + 15 text-anchor="end" class="total">"Total"</text>
            <text x=LABEL y=y + 15 class="total" data-testid="usage-chart-total">{label(&total)}</text>
        </svg>
        <ul class="legend" aria-hidden="true">
            <li><span class="swatch busy"></span>"busy GPU-hours (by utilisation)"</li>
            <li><span class="swatch idle"></span>"the rest of the GPU-hours held"</li>
        </ul>
    }
}

/// Milliseconds since the epoch as RFC 3339 in UTC, to the second: `2026-12-01T00:00:00Z`.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil-from-days; `time` is a server dependency, and this runs in the browser too.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_in_rfc_3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_200_000), "2026-12-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000 + 3_661_000), "2000-02-29T01:01:01Z");
    }
}
