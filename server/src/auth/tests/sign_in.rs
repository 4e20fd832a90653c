//! Signing in, with its throttle and where it sends a person next, and setting up the first admin.

use super::Browser;
use crate::auth::safe_next;
use crate::testing::{TestApp, ADMIN, ADMIN_PASSWORD, MAJIN};
use axum::body::Body;
use axum::http::{header, Request, StatusCode};

#[tokio::test]
async fn an_unknown_name_and_a_wrong_password_get_the_same_answer() {
    let app = TestApp::new(MAJIN).await;
    let wrong = Browser::new(&app).sign_in(ADMIN, "not the password").await;
    let unknown = Browser::new(&app)
        .sign_in("nobody", "not the password")
        .await;
    assert_eq!(wrong.status, StatusCode::SEE_OTHER);
    assert_eq!(wrong.location(), "/login?error=wrong&next=/nodes");
    assert_eq!(unknown.location(), wrong.location());
    let page = Browser::new(&app).get(wrong.location()).await;
    assert!(
        page.body.contains("The name or the password is wrong."),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn the_throttle_engages_after_repeated_failures_even_for_the_right_password() {
    let app = TestApp::new(MAJIN).await;
    for _ in 0..5 {
        let failed = Browser::new(&app).sign_in(ADMIN, "guess").await;
        assert_eq!(failed.location(), "/login?error=wrong&next=/nodes");
    }
    let throttled = Browser::new(&app).sign_in(ADMIN, ADMIN_PASSWORD).await;
    assert_eq!(
        throttled.location(),
        "/login?error=throttled&wait=30&next=/nodes"
    );
    let page = Browser::new(&app).get(throttled.location()).await;
    assert!(
        page.body
            .contains("Too many failed sign-ins: wait 30 seconds, then try again."),
        "{}",
        page.body
    );
    // An unknown name is throttled alike, so the throttle gives no name away.
    for _ in 0..5 {
        Browser::new(&app).sign_in("nobody", "guess").await;
    }
    let unknown = Browser::new(&app).sign_in("nobody", "guess").await;
    assert_eq!(
        unknown.location(),
        "/login?error=throttled&wait=30&next=/nodes"
    );
}

#[tokio::test]
async fn a_sign_in_form_without_its_token_does_not_sign_in() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    browser.get("/login").await;
    let answer = browser
        .post_form(
            "/login",
            &[
                ("name", ADMIN),
                ("password", ADMIN_PASSWORD),
                ("csrf", "forged"),
            ],
        )
        .await;
    assert_eq!(answer.location(), "/login?error=expired&next=/");
    assert_eq!(browser.get("/").await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_page_sends_a_visitor_to_sign_in_and_the_first_start_to_setup() {
    let app = TestApp::new(MAJIN).await;
    let mut visitor = Browser::new(&app);
    let answer = visitor.get("/machines/majin").await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    assert_eq!(answer.location(), "/login?next=/machines/majin");

    sqlx::query("DELETE FROM users")
        .execute(&app.pool)
        .await
        .unwrap();
    let mut first = Browser::new(&app);
    assert_eq!(first.get("/").await.location(), "/setup");
    let setup = first.get("/setup").await;
    assert!(
        setup.body.contains("Make the first admin"),
        "{}",
        setup.body
    );
    let csrf = setup.csrf();
    let mismatch = first
        .post_form(
            "/setup",
            &[
                ("name", "root-admin"),
                ("password", "a long password"),
                ("again", "another one!!"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(mismatch.location(), "/setup?error=mismatch");
    let made = first
        .post_form(
            "/setup",
            &[
                ("name", "root-admin"),
                ("password", "a long password"),
                ("again", "a long password"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(made.location(), "/");
    assert_eq!(
        first.get("/").await.status,
        StatusCode::OK,
        "signed in as the new admin"
    );
    // Once there is an admin, setup makes no other.
    let mut second = Browser::new(&app);
    let csrf = second.get("/setup").await.csrf();
    let again = second
        .post_form(
            "/setup",
            &[
                ("name", "intruder"),
                ("password", "a long password"),
                ("again", "a long password"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(again.location(), "/login");
    let names: Vec<(String,)> = sqlx::query_as("SELECT name FROM users")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(names, [("root-admin".to_owned(),)]);
}

#[tokio::test]
async fn a_burst_of_wrong_passwords_sent_at_once_gets_no_more_tries_than_the_limit() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    let csrf = browser.get("/login").await.csrf();
    let cookie = browser.cookie.clone().unwrap();
    let tries = (0..40).map(|_| {
        let request = Request::post("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::COOKIE, &cookie)
            .body(Body::from(format!(
                "name={ADMIN}&password=guess&csrf={csrf}"
            )))
            .unwrap();
        app.send(request)
    });
    let answers = futures::future::join_all(tries).await;
    let checked = answers
        .iter()
        .filter(|a| {
            a.headers()
                .get(header::LOCATION)
                .is_some_and(|l| l.to_str().unwrap().starts_with("/login?error=wrong"))
        })
        .count();
    assert_eq!(checked, 5, "the account's limit of tries, and not one more");
}

#[test]
fn after_signing_in_only_a_plain_path_of_this_console_is_followed() {
    for kept in ["/", "/nodes", "/machines/majin?tab=gpus", "/a%2F%2Fb"] {
        assert_eq!(safe_next(kept), kept);
    }
    for other_site in [
        "/\t/evil.example",
        "/\n/evil.example",
        "/\r/evil.example",
        "/ /evil.example",
        "//evil.example",
        "/\\evil.example",
        "\\\\evil.example",
        "https://evil.example",
        "evil.example",
        "/\u{a0}/evil.example",
        "",
    ] {
        assert_eq!(safe_next(other_site), "/", "{other_site:?}");
    }
}

#[tokio::test]
async fn a_sign_in_with_a_next_that_a_browser_reads_as_another_site_goes_home() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    let csrf = browser.get("/login").await.csrf();
    let answer = browser
        .post_form(
            "/login",
            &[
                ("name", ADMIN),
                ("password", ADMIN_PASSWORD),
                ("csrf", &csrf),
                ("next", "/\t/evil.example"),
            ],
        )
        .await;
    assert_eq!(answer.location(), "/");
}

#[tokio::test]
async fn setup_once_an_admin_exists_refuses_before_it_looks_at_the_password() {
    let app = TestApp::new(MAJIN).await;
    // A password no check would pass: refused as taken, so nothing was checked or hashed first.
    let huge = "x".repeat(crate::input::MAX_PASSWORD_LEN * 10);
    let refused = crate::accounts::create_first_admin(&app.pool, "mallory", &huge).await;
    assert!(
        matches!(refused, Err(crate::error::ApiError::Conflict(_))),
        "{refused:?}"
    );
    let mut browser = Browser::new(&app);
    let csrf = browser.get("/setup").await.csrf();
    let answer = browser
        .post_form(
            "/setup",
            &[
                ("name", "mallory"),
                ("password", "twelve chars!"),
                ("again", "twelve chars!"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(answer.location(), "/login");
    assert_eq!(crate::accounts::count(&app.pool).await.unwrap(), 1);
}
