//! The gateway benchmark's reference: an axum route that passes every `/v1/*` request on to one engine with
//! the gateway's own client (`server::gateway::engine_client`) and does nothing else: no key, no model read,
//! no choice of engine, no counting. What the extra hop costs by itself, measured in the same run as the
//! gateway (`scripts/bench-gateway`).
//!
//! `relay LISTEN ENGINE`, e.g. `relay 127.0.0.1:3097 127.0.0.1:8080`.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::sync::Arc;

struct Relay {
    client: Client<HttpConnector, Full<axum::body::Bytes>>,
    engine: String,
}

async fn pass_on(State(relay): State<Arc<Relay>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{}{path}", relay.engine).parse::<Uri>() else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    parts.uri = uri;
    match relay
        .client
        .request(hyper::Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(answer) => answer.map(Body::new),
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(engine)) = (args.next(), args.next()) else {
        return Err("usage: relay LISTEN ENGINE (host:port each)".into());
    };
    let relay = Arc::new(Relay {
        client: server::gateway::engine_client(),
        engine,
    });
    let app = Router::new()
        .route("/v1/{*path}", any(pass_on))
        .with_state(relay);
    axum::serve(tokio::net::TcpListener::bind(&listen).await?, app).await?;
    Ok(())
}
