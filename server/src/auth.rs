//! Who may do what. Every request's caller is resolved here, from an API token (`Authorization: Bearer`,
//! for scripts) or a browser session (a cookie, HttpOnly and SameSite=Lax), and checked before any
//! handler runs:
//!
//! - the REST API and `/metrics` need a caller: a viewer reads, an operator changes, an admin manages
//!   accounts and tokens; server functions check their own role (they all arrive as POST);
//! - a change that a browser session makes must carry the session's CSRF token (`x-csrf-token`, or the
//!   form's `csrf` field for the sign-in forms), which another site cannot read;
//! - pages need a caller, and send a visitor to the sign-in page (or to setup, before the first account).

pub mod sessions;
pub mod throttle;

use crate::accounts;
use crate::error::ApiError;
use crate::AppState;
use app::auth::{Caller, CsrfToken, Role, CSRF_HEADER};
use app::views::TokenScope;
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, Method};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use sessions::SqliteSessions;
use std::net::SocketAddr;
use std::time::Instant;
use throttle::Key;
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, Session, SessionManagerLayer};

/// The session's account id.
const USER_ID: &str = "user_id";
/// The session's CSRF token.
const CSRF: &str = "csrf";

/// The longest a request that takes the guard's whole way may take.
const REQUEST_BOUND: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a browser session lasts without being used.
const IDLE: time::Duration = time::Duration::hours(12);

/// The session layer: cookies HttpOnly and SameSite=Lax, and Secure when the console is served over
/// https (`--https`).
///
/// Lax, not Strict: with Strict a link to the console from another site (a chat, a ticket) arrives
/// without the cookie, and the anonymous session made for it replaces the signed-in one. Lax sends the
/// cookie on such a top-level GET, which changes nothing; every change is a POST, PUT or DELETE, which
/// another site's page neither sends the cookie with nor can give the page's CSRF token.
pub fn session_layer(pool: sqlx::SqlitePool, https: bool) -> SessionManagerLayer<SqliteSessions> {
    SessionManagerLayer::new(SqliteSessions::new(pool))
        .with_name("tessera_session")
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(https)
        .with_expiry(Expiry::OnInactivity(IDLE))
}

/// The session layer, except where no session is needed: REST API requests that carry an API token (a
/// script has no session, and making one for each of its requests cost a fifth of the time of a read,
/// BENCHMARKS.md), and the public paths but the sign-in and setup pages (health checks, assets), each of
/// which would otherwise write a session row that lives 12 hours.
#[derive(Clone)]
pub struct SessionsUnlessToken {
    sessions: SessionManagerLayer<SqliteSessions>,
}

impl SessionsUnlessToken {
    /// `sessions` for every request but a script's.
    pub fn new(sessions: SessionManagerLayer<SqliteSessions>) -> SessionsUnlessToken {
        SessionsUnlessToken { sessions }
    }
}

impl<S: Clone> tower::Layer<S> for SessionsUnlessToken
where
    SessionManagerLayer<SqliteSessions>: tower::Layer<S>,
{
    type Service =
        SkipSessions<S, <SessionManagerLayer<SqliteSessions> as tower::Layer<S>>::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        SkipSessions {
            plain: inner.clone(),
            sessions: self.sessions.layer(inner),
        }
    }
}

/// The service of [`SessionsUnlessToken`]: the same routes with sessions and without.
#[derive(Clone)]
pub struct SkipSessions<P, W> {
    plain: P,
    sessions: W,
}

impl<P, W, B> tower::Service<axum::http::Request<B>> for SkipSessions<P, W>
where
    P: tower::Service<axum::http::Request<B>>,
    W: tower::Service<axum::http::Request<B>, Response = P::Response, Error = P::Error>,
{
    type Response = P::Response;
    type Error = P::Error;
    type Future = futures::future::Either<P::Future, W::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        match self.plain.poll_ready(cx) {
            std::task::Poll::Ready(Ok(())) => self.sessions.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        let script = (path.starts_with("/api/") || path == "/metrics")
            && request.headers().contains_key(header::AUTHORIZATION);
        let sessionless = area(request.method(), path) == Area::Public && !has_form(path);
        if script || sessionless {
            futures::future::Either::Left(self.plain.call(request))
        } else {
            futures::future::Either::Right(self.sessions.call(request))
        }
    }
}

/// Where a request goes, which decides what it needs.
#[derive(Debug, PartialEq, Eq)]
enum Area {
    /// Open to anyone: health, the sign-in and setup pages, static files.
    Public,
    /// The REST API and `/metrics`: a caller with at least this role.
    Api(Role),
    /// Server functions: a caller; each checks its own role.
    ServerFunction,
    /// A console page: a caller, or off to sign in.
    Page,
}

fn area(method: &Method, path: &str) -> Area {
    let reads = matches!(*method, Method::GET | Method::HEAD);
    match path {
        "/api/health" | "/api/openapi.json" | "/login" | "/setup" | "/favicon.svg" => Area::Public,
        _ if path.starts_with("/pkg/") => Area::Public,
        // Asking a model a question changes nothing: the console's chat is for every role.
        "/api/playground" => Area::Api(Role::Viewer),
        _ if path.starts_with("/api/users") || path.starts_with("/api/tokens") => {
            Area::Api(Role::Admin)
        }
        // It holds writes while it reads the whole database.
        "/api/check" => Area::Api(Role::Admin),
        // A recipe chooses the program engines run and what they are given: an admin's
        // (docs/src/security.md, "Who may run what").
        "/api/models" if !reads => Area::Api(Role::Admin),
        _ if path.starts_with("/api/") || path == "/metrics" => {
            Area::Api(if reads { Role::Viewer } else { Role::Operator })
        }
        _ if path.starts_with("/rpc/") => Area::ServerFunction,
        "/logout" => Area::ServerFunction,
        _ => Area::Page,
    }
}

/// The public pages with a form, which carry the session's CSRF token.
fn has_form(path: &str) -> bool {
    matches!(path, "/login" | "/setup")
}

/// A fresh random CSRF token.
fn random_token() -> String {
    accounts::random_hex(24)
}

/// The session's CSRF token, made when `make` and the session has none.
async fn csrf_of(session: &Session, make: bool) -> Result<Option<String>, ApiError> {
    let token: Option<String> = session.get(CSRF).await.map_err(ApiError::internal)?;
    match token {
        Some(token) => Ok(Some(token)),
        None if make => {
            let token = random_token();
            session
                .insert(CSRF, &token)
                .await
                .map_err(ApiError::internal)?;
            Ok(Some(token))
        }
        None => Ok(None),
    }
}

/// Resolves the caller of every request and lets it on only if it may go where it goes.
#[derive(Clone)]
pub struct GuardLayer {
    state: AppState,
}

impl GuardLayer {
    /// The guard over `state`'s accounts.
    pub fn new(state: AppState) -> GuardLayer {
        GuardLayer { state }
    }
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            state: self.state.clone(),
        }
    }
}

/// The service of [`GuardLayer`].
#[derive(Clone)]
pub struct Guard<S> {
    inner: S,
    state: AppState,
}

impl<S> tower::Service<Request> for Guard<S>
where
    S: tower::Service<Request, Response = Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = futures::future::Either<
        S::Future,
        futures::future::BoxFuture<'static, Result<Response, std::convert::Infallible>>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        if let Some(caller) = script_let_through(&self.state, &request) {
            request.extensions_mut().insert(caller);
            if matches!(*request.method(), Method::GET | Method::HEAD) {
                return futures::future::Either::Left(self.inner.call(request));
            }
            // A change: the audit entries it writes name its client.
            let address = client_of(
                request.extensions(),
                request.headers(),
                &self.state.trusted_proxies,
            )
            .map(|ip| ip.to_string());
            let change = self.inner.call(request);
            return futures::future::Either::Right(Box::pin(crate::audit::for_client(
                address, change,
            )));
        }
        // The inner service was made ready for this call; a fresh clone stays for the next.
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        let state = self.state.clone();
        let address = client_of(
            request.extensions(),
            request.headers(),
            &state.trusted_proxies,
        )
        .map(|ip| ip.to_string());
        let answer = crate::audit::for_client(address, async move {
            // Every request has a session but a script's (see [`SessionsUnlessToken`]).
            let session = request.extensions().get::<Session>().cloned();
            match check(&state, session.as_ref(), &mut request).await {
                Ok(None) => {
                    let mut ready = ready;
                    tower::Service::call(&mut ready, request).await
                }
                Ok(Some(elsewhere)) => Ok(elsewhere),
                Err(e) => Ok(e.into_response()),
            }
        });
        // A bound on what takes the whole way (pages, server functions, changes), so that a stuck one
        // answers 408 and a stop does not wait on it. A script's read let through above answers from
        // memory and goes without: the timer woke another worker thread on every request.
        futures::future::Either::Right(Box::pin(async move {
            match tokio::time::timeout(REQUEST_BOUND, answer).await {
                Ok(answered) => answered,
                Err(_) => {
                    tracing::warn!("a request took over {REQUEST_BOUND:?}: answered 408");
                    Ok(axum::http::StatusCode::REQUEST_TIMEOUT.into_response())
                }
            }
        }))
    }
}

/// The caller of a script's API request whose token was looked up lately and whose role allows where it
/// goes: such a request passes every check of [`check`] without waiting on anything, and most of the API's
/// traffic is such. Any other request (and any refusal) takes the whole way.
fn script_let_through(state: &AppState, request: &Request) -> Option<Caller> {
    let Area::Api(needed) = area(request.method(), request.uri().path()) else {
        return None;
    };
    let secret = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let grant = accounts::cached_grant(&state.tokens, secret)?;
    (grant.scope == TokenScope::Api && grant.caller.role.allows(needed)).then_some(grant.caller)
}

/// `Ok(None)` lets the request on, with its caller and CSRF token in its extensions; `Ok(Some(..))`
/// answers it instead (a redirect to sign in).
async fn check(
    state: &AppState,
    session: Option<&Session>,
    request: &mut Request,
) -> Result<Option<Response>, ApiError> {
    let pool = &state.pool;
    let area = area(request.method(), request.uri().path());
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let (caller, by_session) = match &bearer {
        Some(secret) => match accounts::grant_by_token(pool, &state.tokens, secret).await? {
            Ok(grant) if grant.scope == TokenScope::Inference => {
                return Err(ApiError::Forbidden(
                    "that API token is for inference only: it calls the gateway (/v1), not the console or /api"
                        .to_owned(),
                ))
            }
            Ok(grant) => (Some(grant.caller), false),
            Err(refusal) => return Err(ApiError::Unauthorized(refusal.message())),
        },
        None => {
            // No session: a script's request with some other Authorization header, anonymous.
            let id: Option<i64> = match session {
                Some(session) => session.get(USER_ID).await.map_err(ApiError::internal)?,
                None => None,
            };
            match id {
                Some(id) => (accounts::caller_by_id(pool, id).await?, true),
                None => (None, false),
            }
        }
    };
    // Pages carry the token in their forms (the sign-in page above all); the rest only check it. A page
    // that sends its visitor to sign in needs none, and gets no session stored for it.
    let path = request.uri().path();
    let make = match area {
        Area::Page => caller.is_some(),
        Area::Public => has_form(path),
        Area::Api(_) | Area::ServerFunction => false,
    };
    let csrf = match session {
        Some(session) if bearer.is_none() => csrf_of(session, make).await?,
        _ => None,
    };
    let unsafe_method = !matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    match &area {
        Area::Public => {}
        Area::Api(_) | Area::ServerFunction => {
            let Some(caller) = &caller else {
                return Err(ApiError::Unauthorized(
                    "sign in, or send an API token as Authorization: Bearer tsr_…".to_owned(),
                ));
            };
            // The sign-out form posts its token as a field, checked by its handler.
            let form = request.uri().path() == "/logout";
            if by_session && unsafe_method && !form {
                let sent = request
                    .headers()
                    .get(CSRF_HEADER)
                    .and_then(|v| v.to_str().ok());
                let matches = match (sent, csrf.as_deref()) {
                    (Some(sent), Some(ours)) => same_token(ours, sent),
                    _ => false,
                };
                if !matches {
                    return Err(ApiError::Forbidden(
                        "this change lacks the page's CSRF token; reload the page and try again"
                            .to_owned(),
                    ));
                }
            }
            if let Area::Api(needed) = area {
                if !caller.role.allows(needed) {
                    return Err(ApiError::Forbidden(format!(
                        "{} is {}: this needs the {} role",
                        caller.name,
                        caller.role.with_article(),
                        needed.as_str()
                    )));
                }
            }
        }
        Area::Page => {
            if caller.is_none() {
                let to = if accounts::count(pool).await? == 0 {
                    "/setup".to_owned()
                } else {
                    let here = request
                        .uri()
                        .path_and_query()
                        .map(|p| p.as_str().to_owned())
                        .unwrap_or_default();
                    format!("/login?next={}", app::address::query_value(&here))
                };
                return Ok(Some(Redirect::to(&to).into_response()));
            }
        }
    }
    if let Some(caller) = caller {
        request.extensions_mut().insert(caller);
    }
    if let Some(token) = csrf {
        request.extensions_mut().insert(CsrfToken(token));
    }
    Ok(None)
}

/// Where to go after signing in: a plain path of this console, never another site. Only visible ASCII
/// is kept, because a browser drops tabs and line breaks from a URL (`/\t/evil.example` becomes
/// `//evil.example`, another site) and reads `\` as `/`.
fn safe_next(next: &str) -> &str {
    let plain = next.bytes().all(|b| b.is_ascii_graphic() && b != b'\\');
    if plain && next.starts_with('/') && !next.starts_with("//") {
        next
    } else {
        "/"
    }
}

/// The caller the guard resolved, for handlers that record who did what.
pub struct Actor(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Actor, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .map(Actor)
            .ok_or_else(|| ApiError::Unauthorized("sign in, or send an API token".to_owned()))
    }
}

/// The address at the other end of a connection, plain or over TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote(pub SocketAddr);

impl<L>
    axum::extract::connect_info::Connected<
        axum::serve::IncomingStream<'_, crate::listeners::Closing<L>>,
    > for Remote
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    fn connect_info(
        stream: axum::serve::IncomingStream<'_, crate::listeners::Closing<L>>,
    ) -> Remote {
        Remote(*stream.remote_addr())
    }
}

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, crate::tls::TlsListener>>
    for Remote
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, crate::tls::TlsListener>) -> Remote {
        Remote(*stream.remote_addr())
    }
}

/// The address a request came from, when the server knows it: the connection's, or where that is a
/// trusted proxy, the client its X-Forwarded-For names.
pub struct Peer(pub String);

impl FromRequestParts<AppState> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Peer, Self::Rejection> {
        Ok(Peer(
            client_of(&parts.extensions, &parts.headers, &state.trusted_proxies)
                .map_or_else(|| "unknown".to_owned(), |ip| ip.to_string()),
        ))
    }
}

/// The client of a request with these `extensions` and `headers`: see [`client`]. None where the
/// connection's address is not known (a test calling the router directly).
fn client_of(
    extensions: &axum::http::Extensions,
    headers: &axum::http::HeaderMap,
    trusted: &[std::net::IpAddr],
) -> Option<std::net::IpAddr> {
    let ConnectInfo(Remote(remote)) = extensions.get::<ConnectInfo<Remote>>()?;
    let forwarded = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok());
    Some(client(remote.ip(), forwarded, trusted))
}

/// Who sent a request that reached us from `remote`: `remote` itself, unless it is a trusted proxy;
/// then the last address of X-Forwarded-For (`forwarded`, each header's list in order) that is not one.
/// A client may write anything at the list's start, so it is read from the end, past the proxies only;
/// a hop that is no address ends the walk at the proxy that wrote it, since what lies before it is the
/// client's to choose.
fn client<'a>(
    remote: std::net::IpAddr,
    forwarded: impl Iterator<Item = &'a str>,
    trusted: &[std::net::IpAddr],
) -> std::net::IpAddr {
    let hops: Vec<&str> = forwarded.flat_map(|list| list.split(',')).collect();
    let mut client = remote;
    for hop in hops.into_iter().rev() {
        if !trusted.contains(&client) {
            break;
        }
        match hop_address(hop.trim()) {
            Some(address) => client = address,
            None => break,
        }
    }
    client
}

/// A hop of X-Forwarded-For as proxies write it: an address, or one with its port (`203.0.113.7:4711`,
/// `[2001:db8::1]:443`).
fn hop_address(hop: &str) -> Option<std::net::IpAddr> {
    hop.parse()
        .ok()
        .or_else(|| hop.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()))
}

/// The sign-in form.
#[derive(Debug, Deserialize)]
pub struct SignIn {
    name: String,
    password: String,
    csrf: String,
    #[serde(default)]
    next: String,
}

async fn form_csrf_matches(session: &Session, sent: &str) -> Result<bool, ApiError> {
    Ok(csrf_of(session, false)
        .await?
        .is_some_and(|token| same_token(&token, sent)))
}

/// Whether the token sent is the session's, in time that does not depend on how much of it matches, so
/// that its answers' timing does not leak the token a byte at a time.
fn same_token(ours: &str, sent: &str) -> bool {
    use subtle::ConstantTimeEq;
    ours.as_bytes().ct_eq(sent.as_bytes()).into()
}

/// `POST /login`: the same answer for an unknown name and a wrong password; throttled per account and per
/// address.
pub async fn sign_in(
    State(state): State<AppState>,
    session: Session,
    Peer(peer): Peer,
    Form(form): Form<SignIn>,
) -> Result<Redirect, ApiError> {
    let back = |error: &str| {
        Redirect::to(&format!(
            "/login?error={error}&next={}",
            app::address::query_value(safe_next(&form.next))
        ))
    };
    if !form_csrf_matches(&session, &form.csrf).await? {
        return Ok(back("expired"));
    }
    let keys = [Key::Account(form.name.clone()), Key::Address(peer)];
    let reservation = match state.throttle.reserve(&keys, Instant::now()) {
        Ok(reservation) => reservation,
        Err(wait) => {
            return Ok(Redirect::to(&format!(
                "/login?error=throttled&wait={}&next={}",
                // Whole seconds, rounded up: never a wait of 0.
                wait.as_millis().div_ceil(1000).max(1),
                app::address::query_value(safe_next(&form.next))
            )));
        }
    };
    // A wrong password (or a request cancelled while it is checked) leaves the try counted.
    match accounts::authenticate(&state.pool, &form.name, &form.password).await? {
        None => Ok(back("wrong")),
        Some((id, _)) => {
            state.throttle.succeed(reservation);
            start_session(&session, id).await?;
            Ok(Redirect::to(safe_next(&form.next)))
        }
    }
}

/// A signed-in session: a new id (so that one planted before sign-in is worth nothing) and a new token.
async fn start_session(session: &Session, id: i64) -> Result<(), ApiError> {
    session.cycle_id().await.map_err(ApiError::internal)?;
    session
        .insert(USER_ID, id)
        .await
        .map_err(ApiError::internal)?;
    session
        .insert(CSRF, random_token())
        .await
        .map_err(ApiError::internal)
}

/// The sign-out form.
#[derive(Debug, Deserialize)]
pub struct SignOut {
    csrf: String,
}

/// `POST /logout`.
pub async fn sign_out(session: Session, Form(form): Form<SignOut>) -> Result<Redirect, ApiError> {
    if !form_csrf_matches(&session, &form.csrf).await? {
        return Err(ApiError::Forbidden(
            "the sign-out form lacks its CSRF token; reload the page and try again".to_owned(),
        ));
    }
    session.flush().await.map_err(ApiError::internal)?;
    Ok(Redirect::to("/login"))
}

/// The setup form, which makes the first admin.
#[derive(Debug, Deserialize)]
pub struct SetUp {
    name: String,
    password: String,
    again: String,
    csrf: String,
}

/// `POST /setup`: only while no account exists.
pub async fn set_up(
    State(state): State<AppState>,
    session: Session,
    Form(form): Form<SetUp>,
) -> Result<Redirect, ApiError> {
    if !form_csrf_matches(&session, &form.csrf).await? {
        return Ok(Redirect::to("/setup?error=expired"));
    }
    if form.password != form.again {
        return Ok(Redirect::to("/setup?error=mismatch"));
    }
    let id = match accounts::create_first_admin(&state.pool, &form.name, &form.password).await {
        Ok((id, _)) => id,
        Err(ApiError::Conflict(_)) => return Ok(Redirect::to("/login")),
        Err(ApiError::Unprocessable(why)) => {
            return Ok(Redirect::to(&format!(
                "/setup?error={}",
                app::address::query_value(&why)
            )))
        }
        Err(e) => return Err(e),
    };
    start_session(&session, id).await?;
    Ok(Redirect::to("/"))
}

#[cfg(test)]
mod tests;
