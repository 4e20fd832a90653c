//! The usage report: GPU-hours, use and energy over a period, as JSON or CSV, and the gateway's requests as
//! CSV. Its own room because the period and grouping query is read only here.

use crate::error::ApiError;
use crate::AppState;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use placement::{Grouping, UsageReport};
use serde::Deserialize;

/// `?from=…&to=…&by=…`: a period in RFC 3339 (the last 24 hours unless said) and what to add up by.
#[derive(Debug, Deserialize)]
pub(super) struct UsageQuery {
    from: Option<String>,
    to: Option<String>,
    by: Option<String>,
}

impl UsageQuery {
    /// The period in milliseconds since the epoch, and the grouping.
    fn read(&self) -> Result<(u64, u64, Grouping), ApiError> {
        let time = |name: &str, text: &Option<String>| -> Result<Option<u64>, ApiError> {
            text.as_deref()
                .map(|t| {
                    time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                        .ok()
                        .and_then(|at| u64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok())
                        .ok_or_else(|| {
                            ApiError::BadRequest(format!(
                                "{name} must be a time such as 2026-12-01T00:00:00Z, not {t:?}"
                            ))
                        })
                })
                .transpose()
        };
        let to = time("to", &self.to)?.unwrap_or_else(crate::fleet::usage::now_ms);
        let from =
            time("from", &self.from)?.unwrap_or(to.saturating_sub(24 * placement::usage::HOUR_MS));
        if from >= to {
            return Err(ApiError::Unprocessable("from must be before to".to_owned()));
        }
        let by = match self.by.as_deref() {
            None => Grouping::default(),
            Some(name) => Grouping::parse(name).ok_or_else(|| {
                ApiError::BadRequest(format!(
                    "by must be machine, group, model or worker, not {name:?}"
                ))
            })?,
        };
        Ok((from, to, by))
    }
}

fn usage_query(
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(u64, u64, Grouping), ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    query.read()
}

/// `GET /api/usage`: GPU-hours, use and energy over a period, split among sharers by their share.
pub(super) async fn usage(
    State(state): State<AppState>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<UsageReport>, ApiError> {
    let (from, to, by) = usage_query(query)?;
    Ok(Json(state.fleet.usage(from, to, by).await?))
}

/// `GET /api/usage.csv`: the same report as CSV, the figures as the Usage page shows them.
pub(super) async fn usage_csv(
    State(state): State<AppState>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let (from, to, by) = usage_query(query)?;
    let report = state.fleet.usage(from, to, by).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!(
                    "attachment; filename=\"tessera-usage-by-{}.csv\"",
                    by.as_str()
                ),
            ),
        ],
        report.to_csv(),
    ))
}

/// `GET /api/usage/requests.csv`: the gateway's requests over the period, per model and API token.
pub(super) async fn requests_csv(
    State(state): State<AppState>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let (from, to, _) = usage_query(query)?;
    let requests = state.fleet.calls().report(&state.pool, from, to).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"tessera-requests.csv\"",
            ),
        ],
        placement::usage::requests_csv(&requests),
    ))
}
