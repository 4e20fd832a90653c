//! Accounts and tokens on a real SQLite file.

use super::*;
use crate::input::{NewToken, NewUser};
use crate::testing::{TestApp, ADMIN, MAJIN};

fn new_user(name: &str, role: Role, password: &str) -> Result<NewUser, ApiError> {
    NewUser::parse(name.to_owned(), role, password.to_owned())
}

#[test]
fn bytes_are_written_as_lower_case_hex() {
    assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
    assert_eq!(random_hex(24).len(), 48);
}

#[test]
fn a_password_is_stored_as_an_argon2id_hash_that_only_it_matches() {
    let hash = hash_password("correct horse battery").unwrap();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(!hash.contains("correct horse"));
    assert!(verify_password(&hash, "correct horse battery"));
    assert!(!verify_password(&hash, "correct horse batterx"));
    assert!(!verify_password("not a hash", "correct horse battery"));
}

#[tokio::test]
async fn an_account_needs_a_good_name_a_long_password_and_a_name_of_its_own() {
    let app = TestApp::new(MAJIN).await;
    let pool = &app.pool;
    let short = new_user("otto", Role::Operator, "short");
    assert_eq!(
        short.unwrap_err().to_string(),
        "a password needs 12 to 1024 characters; this one has 5"
    );
    let hostile = new_user(
        "<script>alert(1)</script>",
        Role::Viewer,
        "long enough pass",
    );
    assert!(hostile
        .unwrap_err()
        .to_string()
        .starts_with("name \"<script>alert(1)</script>\": use 1 to 63 letters"));
    create_user(
        pool,
        &new_user("otto", Role::Operator, "long enough pass").unwrap(),
        ADMIN,
    )
    .await
    .unwrap();
    let again = create_user(
        pool,
        &new_user("otto", Role::Viewer, "long enough pass").unwrap(),
        ADMIN,
    )
    .await;
    assert!(matches!(again, Err(ApiError::Conflict(_))));
    let found = authenticate(pool, "otto", "long enough pass")
        .await
        .unwrap();
    assert_eq!(found.map(|(_, c)| c.role), Some(Role::Operator));
    assert_eq!(
        authenticate(pool, "otto", "wrong password!").await.unwrap(),
        None
    );
    assert_eq!(
        authenticate(pool, "nobody", "long enough pass")
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn the_last_admin_stays_and_no_one_removes_their_own_account() {
    let app = TestApp::new(MAJIN).await;
    let pool = &app.pool;
    let refused = delete_user(pool, ADMIN, "someone").await;
    assert!(
        matches!(&refused, Err(ApiError::Conflict(m)) if m.contains("last admin")),
        "{refused:?}"
    );
    create_user(
        pool,
        &new_user("grace", Role::Admin, "long enough pass").unwrap(),
        ADMIN,
    )
    .await
    .unwrap();
    let own = delete_user(pool, ADMIN, ADMIN).await;
    assert!(
        matches!(&own, Err(ApiError::Conflict(m)) if m.contains("your own account")),
        "{own:?}"
    );
    delete_user(pool, ADMIN, "grace").await.unwrap();
    assert_eq!(
        users(pool)
            .await
            .unwrap()
            .iter()
            .map(|u| u.name.as_str())
            .collect::<Vec<_>>(),
        ["grace"]
    );
}

#[tokio::test]
async fn a_token_is_stored_as_its_digest_and_shown_once() {
    let app = TestApp::new(MAJIN).await;
    let pool = &app.pool;
    let ci = NewToken::parse("ci".to_owned(), TokenLimits::default()).unwrap();
    let issued = create_token(pool, ADMIN, &ci, ADMIN).await.unwrap();
    assert!(issued.secret.starts_with(TOKEN_PREFIX));
    assert!(issued.secret.starts_with(&issued.token.prefix));
    let stored: Vec<(String,)> = sqlx::query_as("SELECT hash FROM api_tokens")
        .fetch_all(pool)
        .await
        .unwrap();
    assert!(stored
        .iter()
        .all(|(h,)| !h.contains(&issued.secret[TOKEN_PREFIX.len()..])));
    let cache = TokenCache::default();
    let grant = grant_by_token(pool, &cache, &issued.secret)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(grant.caller.name, ADMIN);
    assert!(tokens(pool)
        .await
        .unwrap()
        .iter()
        .any(|t| t.name == "ci" && t.last_used_at.is_some()));
    revoke_token(pool, issued.token.id, ADMIN).await.unwrap();
    assert!(
        grant_by_token(pool, &cache, &issued.secret)
            .await
            .unwrap()
            .is_ok(),
        "remembered a while"
    );
    cache.forget();
    assert_eq!(
        grant_by_token(pool, &cache, &issued.secret)
            .await
            .unwrap()
            .err(),
        Some(Refusal::Unknown)
    );
    assert!(matches!(
        revoke_token(pool, issued.token.id, ADMIN).await,
        Err(ApiError::NotFound(_))
    ));
}

fn new_token(
    scope: TokenScope,
    models: Option<&[&str]>,
    expires_at: Option<&str>,
) -> Result<NewToken, ApiError> {
    let limits = TokenLimits {
        scope,
        models: models.map(|m| m.iter().map(|m| m.to_string()).collect()),
        expires_at: expires_at.map(str::to_owned),
    };
    NewToken::parse("chat".to_owned(), limits)
}

#[test]
fn a_token_limited_to_models_must_be_an_inference_token_and_expire_in_the_future() {
    let refused = |new: Result<NewToken, ApiError>| match new {
        Err(ApiError::Unprocessable(message)) => message,
        other => panic!("accepted: {other:?}"),
    };
    assert!(refused(new_token(TokenScope::Api, Some(&["glm-5.3"]), None)).contains("scope"));
    assert!(refused(new_token(TokenScope::Inference, Some(&[]), None)).contains("at least one"));
    assert!(refused(new_token(TokenScope::Inference, None, Some("tomorrow"))).contains("RFC 3339"));
    assert!(refused(new_token(
        TokenScope::Inference,
        None,
        Some("2020-01-01T00:00:00Z")
    ))
    .contains("has passed"));
    let token = new_token(
        TokenScope::Inference,
        Some(&["glm-5.3", "embedder", "glm-5.3"]),
        Some("2999-01-31T01:00:00.5+01:00"),
    )
    .unwrap();
    let limits = token.limits();
    assert_eq!(
        limits.models.as_deref(),
        Some(&["embedder".to_owned(), "glm-5.3".to_owned()][..])
    );
    assert_eq!(limits.expires_at.as_deref(), Some("2999-01-31T00:00:00Z"));
}

#[tokio::test]
async fn an_expired_token_is_refused_with_when_it_expired_even_while_it_is_remembered() {
    use time::format_description::well_known::Rfc3339;
    let app = TestApp::new(MAJIN).await;
    let pool = &app.pool;
    let soon = (time::OffsetDateTime::now_utc() + time::Duration::seconds(2))
        .format(&Rfc3339)
        .unwrap();
    let token = new_token(TokenScope::Inference, Some(&["glm-5.3"]), Some(&soon)).unwrap();
    let issued = create_token(pool, ADMIN, &token, ADMIN).await.unwrap();
    let cache = TokenCache::default();
    let grant = grant_by_token(pool, &cache, &issued.secret)
        .await
        .unwrap()
        .unwrap();
    assert!(grant.may_call("glm-5.3") && !grant.may_call("embedder"));
    assert_eq!(grant.scope, TokenScope::Inference);
    assert!(cached_grant(&cache, &issued.secret).is_some());

    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    assert!(
        cached_grant(&cache, &issued.secret).is_none(),
        "the cache lets it go when it expires"
    );
    assert_eq!(
        grant_by_token(pool, &cache, &issued.secret)
            .await
            .unwrap()
            .err(),
        Some(Refusal::Expired(token.limits().expires_at.clone().unwrap()))
    );
}
