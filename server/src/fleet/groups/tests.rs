//! Sharing groups through the REST API, on a real SQLite file.

use crate::inventory::demo::demo_catalog;
use crate::testing::{majin_and_atlas_with_catalog, TestApp};
use axum::http::{Method, StatusCode};
use placement::holder::Holder;
use serde_json::{json, Value};

async fn app() -> TestApp {
    majin_and_atlas_with_catalog().await
}

/// text-router on atlas:1 at revision 2: glm-5.3 at 40 %, then speech at 10 %.
async fn text_router_at_revision_2() -> TestApp {
    let app = app().await;
    app.deploy(json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 40}))
        .await;
    app.deploy(json!({"model": "speech", "gpus": ["atlas:1"], "share": 10, "revision": 1}))
        .await;
    app
}

fn step_names(change: &Value) -> Vec<String> {
    change["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| match (s.get("Stop"), s.get("Start")) {
            (Some(m), _) => format!("stop {}", m.as_str().unwrap()),
            (_, Some(start)) => format!("start {} {}", start[0].as_str().unwrap(), start[1]),
            _ => panic!("a step: {s}"),
        })
        .collect()
}

#[test]
fn a_sharer_is_shown_by_its_own_name() {
    let shown = |unit| {
        let holder = Holder::parse(unit);
        (holder.name(), holder.group())
    };
    assert_eq!(shown("listen"), ("listen", None));
    assert_eq!(
        shown("group:text-router/glm-5.3@atlas"),
        ("glm-5.3", Some("text-router"))
    );
}

#[tokio::test]
async fn a_model_with_no_group_starts_one_named_after_it() {
    let app = app().await;
    let (status, change) = app
        .deploy(json!({"model": "vision", "gpus": ["atlas:0"], "share": 25}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
    assert_eq!(change["group"], "vision");
    assert_eq!(change["line"], "Tessera names the group after this model.");
    assert_eq!(change["revision"], 1);
    assert_eq!(step_names(&change), ["start vision 2500"]);
    let (_, group) = app.get("/api/groups/vision").await;
    assert_eq!(group["gpus"], json!(["atlas:0"]));
    assert_eq!(
        plan_of(&group),
        json!([{"name": "vision", "share_percent": 25.0, "locked": false}])
    );
    let (_, atlas) = app.get("/api/machines/atlas").await;
    assert_eq!(
        atlas["gpus"][0]["summary"],
        "shared: vision 24 GB — 24 GB taken"
    );
    assert_eq!(atlas["gpus"][0]["sharers"][0]["group"], "vision");
}

#[tokio::test]
async fn a_model_joins_the_group_on_its_gpus_and_a_shrinking_member_restarts_first() {
    let app = app().await;
    let (_, first) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 60}))
        .await;
    assert_eq!(
        first["line"], "This model joins text-router.",
        "the recipe names the group"
    );
    let (status, body) = app
        .deploy(json!({"model": "speech", "gpus": ["atlas:1"], "share": 10}))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "joining names the revision: {body}"
    );
    let (status, change) =
        app.deploy(json!({"model": "speech", "gpus": ["atlas:1"], "share": 10, "shares": {"glm-5.3": 40}, "revision": 1})).await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
    assert_eq!(change["line"], "This model joins text-router.");
    assert_eq!(change["revision"], 2);
    assert_eq!(
        step_names(&change),
        ["stop glm-5.3", "start glm-5.3 4000", "start speech 1000"]
    );
    let restarts: Vec<&str> = change["restarts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["member"].as_str().unwrap())
        .collect();
    assert_eq!(restarts, ["glm-5.3", "speech"]);
}

#[tokio::test]
async fn a_plan_change_restarts_only_the_members_whose_share_changed() {
    let app = text_router_at_revision_2().await;
    let (status, change) = app
        .put_plan(
            "text-router",
            json!({"revision": 2, "shares": {"glm-5.3": 40, "speech": 20}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{change}");
    assert_eq!(step_names(&change), ["stop speech", "start speech 2000"]);
    assert_eq!(change["revision"], 3);
}

#[tokio::test]
async fn a_stale_revision_is_a_409_and_changes_nothing() {
    let app = app().await;
    app.deploy(json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 40}))
        .await;
    let (status, body) = app
        .put_plan(
            "text-router",
            json!({"revision": 7, "shares": {"glm-5.3": 50}}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "group text-router is at revision 1, not 7; read it again (GET /api/groups/text-router) and retry");
    let (_, group) = app.get("/api/groups/text-router").await;
    assert_eq!(
        (group["revision"].clone(), group["total_percent"].clone()),
        (json!(1), json!(40.0))
    );
}

#[tokio::test]
async fn a_refused_plan_is_a_422_with_the_seeds_words_and_changes_nothing() {
    let app = text_router_at_revision_2().await;
    let cases = [
        (
            json!({"glm-5.3": 95, "speech": 10}),
            "The shares add up to more than the accelerator holds.",
        ),
        (
            json!({"glm-5.3": 40, "speech": 0}),
            "speech: A model reserves no share of the accelerator.",
        ),
        (
            json!({"glm-5.3": 40}),
            "speech: A model has no explicit share, so the planned total cannot include it.",
        ),
    ];
    for (shares, message) in cases {
        let (status, body) = app
            .put_plan("text-router", json!({"revision": 2, "shares": shares}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"], message);
        assert_eq!(body["verdict"]["verdict"], "refused");
    }
    let (status, body) = app
        .put_plan(
            "text-router",
            json!({"revision": 2, "shares": {"glm-5.3": 40, "speech": 10, "ghost": 5}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"], "text-router has no member named ghost");
    let (_, group) = app.get("/api/groups/text-router").await;
    assert_eq!(group["revision"], 2);
    assert_eq!(group["total_percent"], 50.0);
}

#[tokio::test]
async fn over_ninety_percent_commits_with_the_warning_in_the_verdict_only() {
    let app = app().await;
    let (status, change) = app
        .deploy(json!({"model": "vision", "gpus": ["atlas:0"], "share": 95}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
}

#[tokio::test]
async fn the_router_moves_into_a_new_group_and_keeps_its_share() {
    let app = app().await;
    app.deploy(json!({"model": "semantic-router", "gpus": ["atlas:1"]}))
        .await;
    app.deploy(json!({"model": "glm-5.3", "gpus": ["atlas:1"], "revision": 1}))
        .await;
    let (status, change) = app
        .deploy(json!({"model": "vision", "gpus": ["atlas:0"], "share": 25}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
    assert_eq!(
        change["restarts"][0],
        json!({"member": "semantic-router", "kind": "moves", "change": "Moves"})
    );
    assert_eq!(
        step_names(&change),
        [
            "stop semantic-router",
            "start semantic-router 1000",
            "start vision 2500"
        ]
    );
    let (_, vision) = app.get("/api/groups/vision").await;
    assert_eq!(
        plan_of(&vision)[0],
        json!({"name": "semantic-router", "share_percent": 10.0, "locked": true})
    );
    let (_, text_router) = app.get("/api/groups/text-router").await;
    assert_eq!(
        text_router["members"].as_array().unwrap().len(),
        1,
        "{text_router}"
    );
    let (status, body) = app
        .put_plan(
            "vision",
            json!({"revision": 1, "shares": {"semantic-router": 20, "vision": 25}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        body["error"],
        "the share of semantic-router is not editable"
    );
}

#[tokio::test]
async fn a_group_counts_against_shared_workers_and_survives_a_restart() {
    let app = app().await;
    let (_, refused) = app
        .deploy(json!({"model": "vision", "gpus": ["majin:0"], "share": 90}))
        .await;
    assert_eq!(
        refused["error"],
        "GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Tessera); it needs 7.2"
    );
    let (status, _) = app
        .deploy(json!({"model": "vision", "gpus": ["majin:0"], "share": 50}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let notebook = json!({"name": "notebook", "requested_resources": {"gpu_requests": {"shared": true, "memory_gb": 3.5, "ids": ["majin:0"]}}});
    let (_, worker) = app.post_worker(&notebook.to_string()).await;
    assert_eq!(
        worker["pending_reasons"],
        json!(["GPU 0 of majin: 4 of 7 GB taken by shared work; it needs 3.5"])
    );
    let app = app.restart().await;
    let (_, majin) = app.get("/api/machines/majin").await;
    assert_eq!(majin["gpus"][0]["taken_gb"], 4.0);
    let (_, groups) = app.get("/api/groups").await;
    assert_eq!(groups[0]["name"], "vision");
}

#[tokio::test]
async fn deploy_errors_say_what_to_fix() {
    let app = app().await;
    let (status, body) = app
        .deploy(json!({"model": "nothing", "gpus": ["atlas:0"]}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        body["error"],
        "the catalog has no model named nothing; GET /api/models lists them"
    );
    let (_, body) = app.deploy(json!({"model": "vision", "gpus": []})).await;
    assert_eq!(
        body["error"],
        "choose at least one GPU, such as \"gpus\": [\"majin:0\"]"
    );
    let (_, body) = app
        .deploy(json!({"model": "vision", "gpus": ["atlas:0", "majin:0"]}))
        .await;
    assert_eq!(
        body["error"],
        "a group's shares are of one GPU's memory: choose GPUs of the same size"
    );
    app.deploy(json!({"model": "vision", "gpus": ["atlas:0"]}))
        .await;
    let (status, body) = app
        .deploy(json!({"model": "vision", "gpus": ["atlas:1"]}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "vision runs in group vision already");
    assert_eq!(app.get("/api/groups/nope").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_catalog_lists_and_takes_models() {
    let app = app().await;
    let (_, models) = app.get("/api/models").await;
    assert_eq!(models.as_array().unwrap().len(), demo_catalog().len());
    let model = json!({"name": "reranker", "engine": "vllm", "default_share_percent": 5, "group": null, "model_path": "BAAI/bge-reranker"});
    let (status, _) = app
        .call(Method::POST, "/api/models", Some(&model.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = app
        .call(Method::POST, "/api/models", Some(&model.to_string()))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body["error"],
        "the catalog has a model named reranker already"
    );
}

/// A group's members as its plan has them (their engines, which the runtime reports as it goes, left out).
fn plan_of(group: &Value) -> Value {
    group["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| json!({"name": m["name"], "share_percent": m["share_percent"], "locked": m["locked"]}))
        .collect()
}
