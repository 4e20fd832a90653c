//! Who may call the gateway, and which models: the caller's API key checked as the rest of the API checks
//! it, and a key's list of models held against the model a request names. Kept apart from the routing so
//! what is refused, and how, is read in one place.

use super::openai_error;
use crate::accounts::{self, Grant};
use crate::AppState;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;

/// The caller's key, checked as the rest of the API checks it (a token seen lately answers from memory).
pub(super) async fn authorised(state: &AppState, headers: &HeaderMap) -> Result<Grant, Response> {
    let unauthorised = |message: &str| {
        openai_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            message.to_owned(),
        )
    };
    let Some(secret) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Err(unauthorised(
            "send a Tessera API token as Authorization: Bearer tsr_…",
        ));
    };
    if let Some(grant) = accounts::cached_grant(&state.tokens, secret) {
        return Ok(grant);
    }
    match accounts::grant_by_token(&state.pool, &state.tokens, secret).await {
        Ok(Ok(grant)) => Ok(grant),
        Ok(Err(refusal)) => Err(unauthorised(&refusal.message())),
        Err(e) => {
            tracing::error!("a gateway key could not be checked: {e}");
            Err(openai_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
                "the key could not be checked; try again".to_owned(),
            ))
        }
    }
}

/// The refusal of `model` to a key limited to `models` (where there is such a list) without it; `None` where
/// the key may call it.
pub(super) fn out_of_scope(models: Option<&[String]>, model: &str) -> Option<Response> {
    let models = models.filter(|_| !accounts::may_call(models, model))?;
    Some(openai_error(
        StatusCode::FORBIDDEN,
        "invalid_request_error",
        "model_not_allowed",
        format!(
            "this API token may call only {}, not {model}",
            models.join(", ")
        ),
    ))
}
