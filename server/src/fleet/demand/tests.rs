//! On-demand members through the fleet and the REST API, on a real SQLite file.

use super::Load;
use crate::testing::{majin_and_atlas_with_catalog, TestApp};
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

fn on_demand(keep_alive: u32) -> Value {
    json!({"mode": "on_demand", "keep_alive": keep_alive})
}

async fn deploy(app: &TestApp, body: Value) -> Value {
    let (status, change) = app.deploy(body).await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
    change
}

/// text-router on atlas:1 (96 GB): the router pinned at 10 % and glm-5.3 at `pinned` %, then vision and
/// speech on demand at `turn` % each.
async fn group(pinned: u32, turn: u32) -> TestApp {
    let app = majin_and_atlas_with_catalog().await;
    deploy(
        &app,
        json!({"model": "semantic-router", "gpus": ["atlas:1"], "share": 10}),
    )
    .await;
    deploy(
        &app,
        json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": pinned, "revision": 1}),
    )
    .await;
    for (revision, model) in [(2, "vision"), (3, "speech")] {
        deploy(
            &app,
            json!({"model": model, "gpus": ["atlas:1"], "share": turn, "revision": revision, "demand": on_demand(60)}),
        )
        .await;
    }
    app
}

/// Who holds what on atlas:1, in GB, as the machine view shows it.
async fn sharers(app: &TestApp) -> Vec<(String, f64)> {
    let (_, atlas) = app.get("/api/machines/atlas").await;
    atlas["gpus"][1]["sharers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["worker"].as_str().unwrap().to_owned(),
                s["gb"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// A request to `model` was answered: its load, if it was fresh, is over.
fn answered(app: &TestApp, model: &str) {
    app.fleet.activity().answered(model, None);
    app.fleet.activity().touch(model);
}

fn held(sharers: &[(String, f64)], who: &str) -> Option<f64> {
    sharers.iter().find(|(w, _)| w == who).map(|(_, gb)| *gb)
}

#[tokio::test]
async fn an_on_demand_model_runs_no_engine_until_asked_and_its_group_keeps_the_room_it_takes_turns_in(
) {
    let app = group(50, 30).await;
    let (_, text_router) = app.get("/api/groups/text-router").await;
    assert_eq!(text_router["total_percent"], 90.0, "{text_router}");
    let vision = &text_router["members"][2];
    assert_eq!(vision["on_demand"]["state"], "not_loaded", "{vision}");
    assert_eq!(vision["on_demand"]["keep_alive_s"], 60);
    let held_now = sharers(&app).await;
    assert_eq!(held(&held_now, "glm-5.3"), Some(48.0));
    assert_eq!(held(&held_now, "vision"), None);
    assert_eq!(held(&held_now, "on-demand turns"), Some(28.8));
    // No engine is wanted for either.
    let served = app.fleet.runtime().engines();
    assert!(
        served
            .iter()
            .all(|e| matches!(e.model.as_deref(), Some("glm-5.3" | "semantic-router"))),
        "{served:?}"
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_load_is_committed_and_the_model_then_holds_its_share() {
    let app = group(50, 30).await;
    let load = app.fleet.load("vision").await.unwrap();
    assert_eq!(load, Load::Loading { unloaded: vec![] });
    assert_eq!(app.fleet.on_demand("vision"), Some(true));
    let held_now = sharers(&app).await;
    assert_eq!(held(&held_now, "vision"), Some(28.8));
    assert_eq!(held(&held_now, "on-demand turns"), None);
    assert_eq!(app.fleet.load("vision").await.unwrap(), Load::Loaded);
    app.fleet.check_ledger().await.unwrap();
    let (_, audit) = app.get("/api/audit?action=model.load").await;
    assert_eq!(audit[0]["target"], "vision", "{audit}");
}

#[tokio::test]
async fn an_on_demand_model_does_not_load_into_turns_room_that_another_program_took_since_it_was_booked(
) {
    let app = majin_and_atlas_with_catalog().await;
    // 26 % of majin's 8 GB: 2.08 GB of the 7 it offers, booked for turns.
    deploy(
        &app,
        json!({"model": "vision", "gpus": ["majin:0"], "share": 26, "demand": on_demand(60)}),
    )
    .await;
    // Another program takes 5 GB more: 2 GB are left, less than the turns room booked.
    app.fleet
        .refresh_machine(crate::fleet::tests::majin_holding(6))
        .await
        .unwrap();
    let refused = app.fleet.load("vision").await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "vision cannot load: its GPUs lack the room even with every idle on-demand model there unloaded; try again when a request in flight or a load under way there ends"
    );
    assert_eq!(app.fleet.on_demand("vision"), Some(false));
    // The program ends: the room is there again, and the model loads.
    app.fleet
        .refresh_machine(crate::fleet::tests::majin_holding(1))
        .await
        .unwrap();
    assert!(matches!(
        app.fleet.load("vision").await,
        Ok(Load::Loading { .. })
    ));
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn when_two_on_demand_models_do_not_fit_together_the_least_recently_used_idle_one_makes_way()
{
    // 60 % pinned leaves 40 %: one 30 % turn at a time.
    let app = group(50, 30).await;
    app.fleet.load("vision").await.unwrap();
    answered(&app, "vision");
    assert_eq!(
        app.fleet.load("speech").await.unwrap(),
        Load::Loading {
            unloaded: vec!["vision".into()]
        }
    );
    answered(&app, "speech");
    assert_eq!(
        app.fleet.load("vision").await.unwrap(),
        Load::Loading {
            unloaded: vec!["speech".into()]
        }
    );
    let held_now = sharers(&app).await;
    assert_eq!(
        held(&held_now, "glm-5.3"),
        Some(48.0),
        "a pinned model stays"
    );
    let taken: f64 = held_now.iter().map(|(_, gb)| gb).sum();
    assert!(taken <= 96.0, "{held_now:?}");
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn on_demand_models_that_fit_together_stay_loaded_together() {
    // 50 % pinned leaves 50 %: both 25 % turns fit at once.
    let app = group(40, 25).await;
    app.fleet.load("vision").await.unwrap();
    assert_eq!(
        app.fleet.load("speech").await.unwrap(),
        Load::Loading { unloaded: vec![] }
    );
    assert_eq!(app.fleet.on_demand("vision"), Some(true));
}

#[tokio::test]
async fn a_model_a_request_waits_for_is_never_unloaded_to_make_room() {
    let app = group(50, 30).await;
    app.fleet.load("vision").await.unwrap();
    answered(&app, "vision");
    let waiting = app.fleet.activity().wait("vision");
    let refused = app.fleet.load("speech").await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "speech cannot load: its GPUs lack the room even with every idle on-demand model there unloaded; try again when a request in flight or a load under way there ends"
    );
    assert_eq!(app.fleet.on_demand("vision"), Some(true));
    drop(waiting);
    assert!(app.fleet.load("speech").await.is_ok());
}

#[tokio::test]
async fn a_fresh_load_whose_request_gave_up_keeps_its_place_until_it_has_answered_once() {
    let app = group(50, 30).await;
    // vision's request loaded it, then gave up waiting (no request waits for it now).
    app.fleet.load("vision").await.unwrap();
    let refused = app.fleet.load("speech").await.unwrap_err();
    assert!(
        refused.to_string().starts_with("speech cannot load"),
        "{refused}"
    );
    // Nor does its keep-alive run out while it loads.
    app.fleet
        .activity()
        .used_at("vision", super::super::usage::now_ms() - 61_000);
    assert_eq!(
        app.fleet.unload_expired().await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(app.fleet.on_demand("vision"), Some(true));
    // Once it has answered, it is idle like any other and makes way.
    answered(&app, "vision");
    assert_eq!(
        app.fleet.load("speech").await.unwrap(),
        Load::Loading {
            unloaded: vec!["vision".into()]
        }
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn an_idle_model_unloads_after_its_keep_alive_and_a_used_one_does_not() {
    let app = group(40, 25).await;
    app.fleet.load("vision").await.unwrap();
    app.fleet.load("speech").await.unwrap();
    answered(&app, "vision");
    answered(&app, "speech");
    assert_eq!(
        app.fleet.unload_expired().await.unwrap(),
        Vec::<String>::new()
    );
    // vision's last use was over its 60 s keep-alive ago; speech was just used.
    app.fleet
        .activity()
        .used_at("vision", super::super::usage::now_ms() - 61_000);
    app.fleet.activity().touch("speech");
    assert_eq!(app.fleet.unload_expired().await.unwrap(), ["vision"]);
    assert_eq!(app.fleet.on_demand("vision"), Some(false));
    assert_eq!(app.fleet.on_demand("speech"), Some(true));
    let (_, audit) = app.get("/api/audit?action=model.unload").await;
    assert_eq!(
        audit[0]["after"]["reason"],
        "no request for its keep-alive of 60 s"
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_plan_change_restarts_only_engines_that_run() {
    let app = group(50, 30).await;
    app.fleet.load("speech").await.unwrap();
    let (_, text_router) = app.get("/api/groups/text-router").await;
    let revision = text_router["revision"].as_i64().unwrap();
    // vision (not loaded) and speech (loaded) both shrink; glm-5.3 turns on-demand.
    let (status, change) = app
        .put_plan(
            "text-router",
            json!({
                "revision": revision,
                "shares": {"semantic-router": 10, "glm-5.3": 50, "vision": 20, "speech": 20},
                "demand": {"glm-5.3": on_demand(120)}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{change}");
    let restarts: Vec<&str> = change["restarts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["member"].as_str().unwrap())
        .collect();
    assert_eq!(restarts, ["speech"], "{change}");
    // glm-5.3 keeps its engine until its keep-alive runs out.
    assert_eq!(app.fleet.on_demand("glm-5.3"), Some(true));
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn the_router_stays_pinned() {
    let app = group(50, 30).await;
    let (_, text_router) = app.get("/api/groups/text-router").await;
    let (status, answer) = app
        .put_plan(
            "text-router",
            json!({
                "revision": text_router["revision"],
                "shares": {"semantic-router": 10, "glm-5.3": 50, "vision": 30, "speech": 30},
                "demand": {"semantic-router": on_demand(60)}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        answer["error"],
        "semantic-router routes every request of its group: it stays pinned"
    );
}

#[tokio::test]
async fn an_on_demand_share_that_does_not_fit_beside_the_pinned_ones_is_refused_by_the_server() {
    let app = group(50, 30).await;
    let (_, text_router) = app.get("/api/groups/text-router").await;
    let (status, answer) = app
        .put_plan(
            "text-router",
            json!({
                "revision": text_router["revision"],
                "shares": {"semantic-router": 10, "glm-5.3": 50, "vision": 45, "speech": 30}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(
        answer["error"],
        "The shares add up to more than the accelerator holds."
    );
    let (status, verdict) = app
        .call(
            Method::POST,
            "/api/plans/validate",
            Some(
                &json!({"members": [
                    {"name": "glm-5.3", "share": 70},
                    {"name": "vision", "share": 30, "demand": on_demand(60)},
                    {"name": "speech", "share": 20, "demand": on_demand(60)}
                ]})
                .to_string(),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(verdict["verdict"], "fits");
    assert_eq!(
        verdict["turns"],
        "On-demand models take turns in the 30% the pinned ones leave."
    );
}

#[tokio::test]
async fn a_keep_alive_out_of_bounds_is_refused_saying_what_to_enter() {
    let app = majin_and_atlas_with_catalog().await;
    let (status, answer) = app
        .deploy(json!({"model": "vision", "gpus": ["atlas:0"], "demand": on_demand(3)}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("a keep-alive is a whole number of seconds from 10 to 604800 (a week)"),
        "{answer}"
    );
    let (status, answer) = app.deploy(json!({"model": "vision", "gpus": ["atlas:0"], "shared": false, "demand": on_demand(60)})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        answer["error"],
        "a model on whole GPUs is always loaded: deploy it with \"shared\": true to load it on demand"
    );
}

#[tokio::test]
async fn usage_counts_an_on_demand_model_only_while_it_is_loaded() {
    let app = group(50, 30).await;
    let names = |app: &TestApp| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT DISTINCT name FROM holdings ORDER BY name")
                .fetch_all(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(names(&app).await, ["glm-5.3", "semantic-router"]);
    app.fleet.load("vision").await.unwrap();
    assert_eq!(names(&app).await, ["glm-5.3", "semantic-router", "vision"]);
    answered(&app, "vision");
    app.fleet
        .activity()
        .used_at("vision", super::super::usage::now_ms() - 61_000);
    app.fleet.unload_expired().await.unwrap();
    let open: Vec<String> =
        sqlx::query_scalar("SELECT name FROM holdings WHERE end_ms IS NULL ORDER BY name")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(open, ["glm-5.3", "semantic-router"]);
}

#[test]
fn a_model_yields_its_room_only_to_the_cold_model_that_still_waits_and_only_until_that_one_loads() {
    let activity = std::sync::Arc::new(super::Activity::new());
    let waiting = activity.wait("speech");
    activity.with("vision", |u| u.yields_to = Some("speech".to_owned()));
    assert!(activity.yielding("vision"));
    assert!(activity.yields_to("vision", "speech"));
    assert!(
        !activity.yields_to("vision", "embedder"),
        "idle to speech's load alone"
    );
    // speech is loaded (vision was not the one unloaded for it): vision takes requests again.
    activity.loaded("speech");
    assert!(!activity.yielding("vision"));
    // Asked again, and then speech gives up waiting: the turn is over.
    activity.with("vision", |u| u.yields_to = Some("speech".to_owned()));
    drop(waiting);
    assert!(!activity.yielding("vision"));
    assert!(!activity.yields_to("vision", "speech"));
}

/// The router at 10 % on atlas:1, then each of `members` (a deploy's fields, less its GPUs and revision)
/// there in order; then vision and speech, on demand among them, loaded (vision first) and idle.
async fn router_and(members: &[Value]) -> TestApp {
    let app = majin_and_atlas_with_catalog().await;
    let router = json!({"model": "semantic-router", "gpus": ["atlas:1"], "share": 10});
    let mut revision = deploy(&app, router).await["revision"].clone();
    for member in members {
        let mut body = member.clone();
        body["gpus"] = json!(["atlas:1"]);
        body["revision"] = revision;
        revision = deploy(&app, body).await["revision"].clone();
    }
    for model in ["vision", "speech"] {
        app.fleet.load(model).await.unwrap();
        answered(&app, model);
    }
    app
}

#[tokio::test]
async fn a_member_that_gives_up_its_replicas_unloads_the_loaded_on_demand_members_that_no_longer_fit_beside_it(
) {
    // The router at 10 % and glm-5.3 with a min of 0 replicas at 45 %, running none: vision and speech,
    // on demand at 25 % each, are loaded together.
    let app = router_and(&[
        json!({"model": "glm-5.3", "share": 45, "replicas": {"min": 0, "max": 1}}),
        json!({"model": "vision", "share": 25, "demand": on_demand(60)}),
        json!({"model": "speech", "share": 25, "demand": on_demand(60)}),
    ])
    .await;
    assert_eq!(
        (app.fleet.on_demand("vision"), app.fleet.on_demand("speech")),
        (Some(true), Some(true))
    );

    // Pinned on every GPU, 10 + 45 and a turn of 25 fits; both turns beside it would be 105 %.
    let (status, answer) = app
        .call(
            Method::PUT,
            "/api/deployments/glm-5.3/replicas",
            Some(&json!({"revision": 4, "replicas": null}).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["unloaded"],
        json!(["vision"]),
        "the least recently used: {answer}"
    );
    assert_eq!(app.fleet.on_demand("vision"), Some(false));
    let held_now = sharers(&app).await;
    assert_eq!(held(&held_now, "glm-5.3"), Some(43.2), "{held_now:?}");
    let taken: f64 = held_now.iter().map(|(_, gb)| gb).sum();
    assert!(taken <= 96.0, "{held_now:?}");
    let (_, audit) = app.get("/api/audit?action=model.replicas").await;
    assert_eq!(
        audit[0]["restarts"],
        json!(["glm-5.3", "vision"]),
        "{audit}"
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_replica_that_finds_no_room_has_idle_on_demand_members_loaded_beside_the_turn_unload_least_recently_used_first(
) {
    // The router at 10 %, vision and speech on demand at 35 % each, glm-5.3 with a min of 0 replicas at
    // 30 %: the plan holds 10 + 35 + 30. vision and speech are loaded together (80 %), idle.
    let app = router_and(&[
        json!({"model": "vision", "share": 35, "demand": on_demand(60)}),
        json!({"model": "speech", "share": 35, "demand": on_demand(60)}),
        json!({"model": "glm-5.3", "share": 30, "replicas": {"min": 0, "max": 1}}),
    ])
    .await;

    // A request for glm-5.3 asks for a replica: 30 % more than the 20 % left.
    let decision = placement::scale::Decision {
        from: 0,
        to: 1,
        why: "1 request waiting with no replica running".to_owned(),
    };
    assert_eq!(app.fleet.scale("glm-5.3", decision).await.unwrap(), 1);
    assert_eq!(
        (app.fleet.on_demand("vision"), app.fleet.on_demand("speech")),
        (Some(false), Some(true)),
        "the least recently used made way"
    );
    let held_now = sharers(&app).await;
    let taken: f64 = held_now.iter().map(|(_, gb)| gb).sum();
    assert!(taken <= 96.0, "{held_now:?}");
    let (_, audit) = app.get("/api/audit?action=model.unload").await;
    assert_eq!(audit[0]["target"], "vision", "{audit}");
    assert_eq!(
        audit[0]["after"]["reason"],
        "idle, it makes room for a replica of glm-5.3"
    );
    app.fleet.check_ledger().await.unwrap();
}
