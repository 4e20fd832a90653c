//! Removing deployed models, models on whole GPUs, and serving changes, through the REST API on a real
//! SQLite file.

use crate::testing::{majin_and_atlas_with_catalog, TestApp};
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

async fn app() -> TestApp {
    majin_and_atlas_with_catalog().await
}

async fn post(app: &TestApp, uri: &str, body: Value) -> (StatusCode, Value) {
    app.call(Method::POST, uri, Some(&body.to_string())).await
}

async fn remove(app: &TestApp, model: &str, revision: i64) -> (StatusCode, Value) {
    app.call(
        Method::DELETE,
        &format!("/api/deployments/{model}?revision={revision}"),
        None,
    )
    .await
}

fn members(group: &Value) -> Vec<(String, f64)> {
    group["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_owned(),
                m["share_percent"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// text-router on atlas:1 at revision 2: glm-5.3 at 40 %, speech at 10 %.
async fn text_router() -> TestApp {
    let app = app().await;
    let (status, body) = post(
        &app,
        "/api/deployments",
        json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 40}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = post(
        &app,
        "/api/deployments",
        json!({"model": "speech", "gpus": ["atlas:1"], "share": 10, "revision": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app
}

#[tokio::test]
async fn a_removed_member_stops_and_the_others_keep_their_shares() {
    let app = text_router().await;
    let (status, body) = remove(&app, "speech", 1).await;
    assert_eq!(status, StatusCode::CONFLICT, "a stale revision: {body}");
    let (_, group) = app.get("/api/groups/text-router").await;
    assert_eq!(members(&group).len(), 2, "nothing changed");

    let (status, change) = remove(&app, "speech", 2).await;
    assert_eq!(status, StatusCode::OK, "{change}");
    assert_eq!(
        change["restarts"],
        json!([{"member": "speech", "kind": "leaves", "change": "Leaves"}])
    );
    assert_eq!(
        change["steps"],
        json!([{"action": "stop", "member": "speech", "Stop": "speech"}])
    );
    let (_, group) = app.get("/api/groups/text-router").await;
    assert_eq!(members(&group), [("glm-5.3".to_owned(), 40.0)]);
    assert_eq!(group["revision"], 3);
    let (_, atlas) = app.get("/api/machines/atlas").await;
    assert_eq!(
        atlas["gpus"][1]["summary"],
        "shared: glm-5.3 38.4 GB — 38.4 GB taken"
    );
}

#[tokio::test]
async fn a_group_ends_with_its_last_member_and_its_gpu_is_whole_again() {
    let app = app().await;
    post(
        &app,
        "/api/deployments",
        json!({"model": "vision", "gpus": ["atlas:0"], "share": 25}),
    )
    .await;
    let (status, body) = remove(&app, "vision", 1).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = app.get("/api/groups/vision").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, atlas) = app.get("/api/machines/atlas").await;
    assert_eq!(atlas["gpus"][0]["mode"], "free");
    let (status, body) = remove(&app, "vision", 1).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
}

#[tokio::test]
async fn the_semantic_router_is_not_removed_from_here() {
    let app = text_router().await;
    post(
        &app,
        "/api/deployments",
        json!({"model": "semantic-router", "gpus": ["atlas:1"], "share": 10, "revision": 2}),
    )
    .await;
    let (status, body) = remove(&app, "semantic-router", 3).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body["error"]
        .as_str()
        .unwrap()
        .contains("is the semantic router"));
}

#[tokio::test]
async fn a_model_on_whole_gpus_holds_them_until_it_is_removed() {
    let app = app().await;
    let (status, change) = post(
        &app,
        "/api/deployments",
        json!({"model": "vision", "gpus": ["atlas:0", "atlas:1"], "shared": false, "args": ["--enforce-eager"]}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
    assert_eq!(change.get("group"), None);
    assert_eq!(
        change["line"],
        "The model takes whole GPUs: GPU 0 of atlas, GPU 1 of atlas."
    );
    let (_, worker) = app.get("/api/workers/vision").await;
    assert_eq!(worker["model"], "vision");
    assert_eq!(worker["gpus"], json!([0, 1]));
    let (_, atlas) = app.get("/api/machines/atlas").await;
    assert_eq!(atlas["gpus"][0]["mode"], "whole");
    assert_eq!(atlas["gpus"][1]["held_by"], "vision");

    let (status, body) = post(
        &app,
        "/api/deployments",
        json!({"model": "vision", "gpus": ["majin:0"], "share": 25}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "a model runs once: {body}");

    let (status, body) = remove(&app, "vision", 1).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, workers) = app.get("/api/workers").await;
    assert_eq!(workers, json!([]));
    let (_, atlas) = app.get("/api/machines/atlas").await;
    assert_eq!(atlas["gpus"][0]["mode"], "free");
}

#[tokio::test]
async fn whole_gpus_in_use_are_refused_and_nothing_is_stored() {
    let app = app().await;
    post(
        &app,
        "/api/deployments",
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    let (status, body) = post(
        &app,
        "/api/deployments",
        json!({"model": "vision", "gpus": ["atlas:0"], "shared": false}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["error"],
        "vision does not fit there: GPU 0 of atlas is shared by 1 worker; it needs a whole GPU"
    );
    let (_, workers) = app.get("/api/workers").await;
    assert_eq!(workers, json!([]));

    let (status, body) = post(
        &app,
        "/api/deployments",
        json!({"model": "vision", "gpus": ["atlas:0", "majin:0"], "shared": false}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["error"],
        "a model on whole GPUs runs on one machine: choose GPUs of one node"
    );
}

#[tokio::test]
async fn a_serving_change_is_stored_against_its_revision() {
    let app = text_router().await;
    let change = |revision: i64, env: Value| {
        json!({"revision": revision, "args": ["--max-model-len", "8192"], "env": env}).to_string()
    };
    let uri = "/api/deployments/glm-5.3/serving";
    let (status, body) = app
        .call(Method::PUT, uri, Some(&change(1, json!({}))))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = app
        .call(Method::PUT, uri, Some(&change(2, json!({"1BAD": "x"}))))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        app.fleet.serving_of("glm-5.3").unwrap().0,
        Vec::<String>::new()
    );

    let (status, body) = app
        .call(
            Method::PUT,
            uri,
            Some(&change(2, json!({"VLLM_LOGGING_LEVEL": "DEBUG"}))),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["restarts"], json!(["glm-5.3"]));
    assert_eq!(body["revision"], 3);
    let (args, env) = app.fleet.serving_of("glm-5.3").unwrap();
    assert_eq!(args, ["--max-model-len", "8192"]);
    assert_eq!(env["VLLM_LOGGING_LEVEL"], "DEBUG");
    // A share change keeps the serving configuration.
    app.call(
        Method::PUT,
        "/api/groups/text-router/plan",
        Some(&json!({"revision": 3, "shares": {"glm-5.3": 30, "speech": 10}}).to_string()),
    )
    .await;
    assert_eq!(app.fleet.serving_of("glm-5.3").unwrap().0, args);
}
