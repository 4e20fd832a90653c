//! Every change lands in the audit log with who, what, before and after; a refused one does not.

use crate::inventory::demo::demo_catalog;
use crate::testing::{majin_and_atlas_with_catalog, TestApp, ADMIN};
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

async fn app() -> TestApp {
    majin_and_atlas_with_catalog().await
}

async fn send(app: &TestApp, method: Method, uri: &str, body: Value) -> (StatusCode, Value) {
    app.call(method, uri, Some(&body.to_string())).await
}

#[tokio::test]
async fn a_plan_change_is_logged_with_before_after_revision_and_restarts() {
    let app = app().await;
    send(
        &app,
        Method::POST,
        "/api/deployments",
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    send(
        &app,
        Method::POST,
        "/api/deployments",
        json!({"model": "vision", "gpus": ["atlas:0"], "share": 25, "revision": 1}),
    )
    .await;
    let (status, _) = send(
        &app,
        Method::PUT,
        "/api/groups/text-router/plan",
        json!({"revision": 2, "shares": {"glm-5.3": 30, "vision": 35}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    let (_, log) = app.get("/api/audit?action=plan").await;
    let entry = &log[0];
    assert_eq!(entry["actor"], ADMIN);
    assert_eq!(entry["action"], "plan.change");
    assert_eq!(entry["target"], "text-router");
    assert_eq!(entry["revision"], 3);
    assert_eq!(
        entry["before"]["shares"],
        json!({"glm-5.3": 40.0, "vision": 25.0})
    );
    assert_eq!(
        entry["after"]["shares"],
        json!({"glm-5.3": 30.0, "vision": 35.0})
    );
    assert_eq!(entry["restarts"], json!(["glm-5.3", "vision"]));

    let (_, deploys) = app.get("/api/audit?action=deploy&target=vision").await;
    assert_eq!(deploys.as_array().unwrap().len(), 1);
    assert_eq!(deploys[0]["after"]["shares"]["vision"], 25.0);

    // The next page: entries older than the last one read.
    let (_, all) = app.get("/api/audit").await;
    let all = all.as_array().unwrap();
    assert!(all.len() >= 3);
    let (_, first) = app.get("/api/audit?limit=2").await;
    let last = first[1]["id"].as_i64().unwrap();
    let (status, next) = app.get(&format!("/api/audit?limit=2&before={last}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(next[0]["id"], all[2]["id"]);
    assert!(next
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["id"].as_i64().unwrap() < last));
}

#[test]
fn an_entry_s_change_is_told_field_by_field_and_named_things_by_name() {
    let before = json!({"shares": {"glm-5.3": 40.0, "vision": 25.0}, "gpus": ["atlas:0"],
        "members": [{"name": "glm-5.3", "share": 4000}, {"name": "vision", "share": 2500}]});
    let after = json!({"shares": {"glm-5.3": 30.0, "vision": 25.0}, "gpus": ["atlas:0", "atlas:1"],
        "members": [{"name": "speech", "share": 1000}, {"name": "glm-5.3", "share": 3000}, {"name": "vision", "share": 2500}]});
    assert_eq!(
        super::changed_fields(Some(&before), Some(&after)),
        [
            r#"gpus: ["atlas:0"] → ["atlas:0","atlas:1"]"#,
            "members.glm-5.3.share: 4000 → 3000",
            r#"members.speech.name: none → "speech""#,
            "members.speech.share: none → 1000",
            "shares.glm-5.3: 40.0 → 30.0",
        ]
    );
    assert_eq!(
        super::changed_fields(None, Some(&json!({"model": "vision"}))),
        [r#"model: none → "vision""#]
    );
    assert!(super::changed_fields(Some(&before), Some(&before)).is_empty());
}

#[tokio::test]
async fn a_refused_or_stale_change_writes_nothing_to_the_log() {
    let app = app().await;
    send(
        &app,
        Method::POST,
        "/api/deployments",
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    let (_, before) = app.get("/api/audit").await;
    let (status, _) = send(
        &app,
        Method::PUT,
        "/api/groups/text-router/plan",
        json!({"revision": 1, "shares": {"glm-5.3": 130}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = send(
        &app,
        Method::PUT,
        "/api/groups/text-router/plan",
        json!({"revision": 7, "shares": {"glm-5.3": 30}}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, after) = app.get("/api/audit").await;
    assert_eq!(before, after);
}

#[tokio::test]
async fn workers_models_accounts_and_tokens_are_logged_too() {
    let app = app().await;
    let worker = json!({"name": "listen", "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 2}}});
    send(&app, Method::POST, "/api/workers", worker).await;
    app.call(Method::DELETE, "/api/workers/listen", None).await;
    send(
        &app,
        Method::POST,
        "/api/users",
        json!({"name": "otto", "role": "operator", "password": "long enough pass"}),
    )
    .await;
    send(
        &app,
        Method::POST,
        "/api/tokens",
        json!({"name": "ci", "user": "otto"}),
    )
    .await;
    let (_, log) = app.get("/api/audit?limit=4").await;
    let actions: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "token.create",
            "user.create",
            "worker.delete",
            "worker.create"
        ]
    );
    assert_eq!(log[2]["before"]["name"], "listen");
    let (_, seeded) = app.get("/api/audit?actor=tessera&action=model").await;
    assert_eq!(
        seeded.as_array().unwrap().len(),
        demo_catalog().len(),
        "the demo catalog, by the server itself"
    );
    let (status, body) = app.get("/api/audit?limit=5000").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn entries_older_than_the_retention_are_deleted_a_batch_at_a_time_and_newer_ones_kept() {
    let app = app().await;
    // 2,500 entries of 2025-01-01, one on the day the retention ends, and what the server just wrote.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500) \
         INSERT INTO audit (at, actor, action, target) \
         SELECT '2025-01-01T00:00:00.000Z', 'ada', 'worker.create', 'w' || i FROM n",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO audit (at, actor, action, target) VALUES ('2025-02-04T00:00:00.000Z', 'ada', 'worker.create', 'kept')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM audit")
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    let all = count().await;
    // 2026-03-11T00:00:00Z, 400 days after 2025-02-04.
    let now_ms = 1_773_187_200_000;
    let tidied = crate::fleet::housekeeping::tidy(
        &app.pool,
        &crate::fleet::housekeeping::Retention::default(),
        now_ms,
        std::time::Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(tidied.audit_deleted, 2500);
    assert_eq!(count().await, all - 2500);
    let (_, kept) = app.get("/api/audit?target=kept").await;
    assert_eq!(
        kept.as_array().unwrap().len(),
        1,
        "written exactly 400 days ago"
    );
    let (_, seeded) = app.get("/api/audit?actor=tessera&action=model").await;
    assert_eq!(seeded.as_array().unwrap().len(), demo_catalog().len());
    // A millisecond later, the entry of 400 days ago goes too.
    let later = crate::audit::forget_before(
        &app.pool,
        now_ms - 400 * 24 * 3_600_000 + 1,
        std::time::Duration::ZERO,
    )
    .await
    .unwrap();
    assert_eq!(later, 1);
}
