//! The console's pages rendered by the server, and its server functions over HTTP, on a real SQLite file.

use super::machines::concerns;
use crate::testing::{majin_and_atlas_with_catalog, shared_worker, TestApp, MAJIN};
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

async fn app() -> TestApp {
    majin_and_atlas_with_catalog().await
}

/// The page at `uri` as the server renders it, resources resolved.
async fn page(app: &TestApp, uri: &str) -> String {
    let (status, body) = app.get(uri).await;
    assert_eq!(status, StatusCode::OK, "{uri}");
    match body {
        Value::String(html) => html,
        other => panic!("{uri} answered JSON: {other}"),
    }
}

async fn deploy(app: &TestApp, body: Value) {
    let (status, answer) = app
        .call(Method::POST, "/api/deployments", Some(&body.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
}

/// A server function called as the browser calls it: JSON in, JSON out.
async fn call_rpc(app: &TestApp, name: &str, body: Value) -> (StatusCode, Value) {
    app.call(
        Method::POST,
        &format!("/rpc/{name}"),
        Some(&body.to_string()),
    )
    .await
}

#[test]
fn a_pending_reason_is_shown_on_the_page_of_the_machine_it_names() {
    assert!(concerns(
        "GPU 0 of majin: 6.5 of 7 GB taken by shared work; it needs 1.5",
        "majin"
    ));
    assert!(concerns(
        "majin has 2 of its 16 CPU cores free; it needs 4",
        "majin"
    ));
    assert!(concerns("majin: 0 GPUs fit; it needs 2", "majin"));
    assert!(!concerns(
        "GPU 0 of majin2: 6.5 of 7 GB taken by shared work; it needs 1.5",
        "majin"
    ));
    assert!(!concerns(
        "majin2 has 2 of its 16 CPU cores free; it needs 4",
        "majin"
    ));
}

#[tokio::test]
async fn the_nodes_tab_names_the_group_its_models_and_the_memory_left() {
    let app = app().await;
    // 6.25 % of each 96 GB GPU is 6 GB: 180 of atlas's 192 GB are left, 93.75 %, shown as 94 %.
    deploy(
        &app,
        json!({"model": "vision", "gpus": ["atlas:0", "atlas:1"], "share": 6.25}),
    )
    .await;
    let html = page(&app, "/nodes").await;
    assert!(
        html.contains("2 of 2 shareable · 180 GB free (94%)"),
        "{html}"
    );
    assert!(html.contains("vision 6.25%"), "{html}");
    assert!(
        html.contains("1 of 1 shareable · 7 GB free (88%)"),
        "majin: {html}"
    );
}

#[tokio::test]
async fn the_machine_page_shows_each_gpu_its_sharers_and_who_waits() {
    let app = TestApp::new(MAJIN).await;
    for (name, gb) in [("listen", 2.2), ("voice", 4.2), ("late", 0.7)] {
        app.post_worker(&shared_worker(name, gb)).await;
    }
    let html = page(&app, "/machines/majin").await;
    for text in [
        "Offers 7 of its 8 GB (1 GB held outside Tessera)",
        "shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken",
        "1 · shared 2.2 GB",
        "1 · shared 4.2 GB",
        "GPU 0 of majin: 6.4 of 7 GB taken by shared work; it needs 0.7",
    ] {
        assert!(html.contains(text), "{text} in {html}");
    }
    assert!(
        html.contains("<svg"),
        "the memory bar is drawn on the server"
    );
    let (status, body) = app.get("/machines/nowhere").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body
        .as_str()
        .unwrap()
        .contains("there is no machine named nowhere"));
}

#[tokio::test]
async fn the_models_tab_says_which_shares_the_driver_enforces_and_which_are_promises() {
    let app = crate::testing::atlas_here_with_catalog().await;
    deploy(
        &app,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &app,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 25}),
    )
    .await;
    let (status, _) = app
        .call(
            Method::PUT,
            "/api/machines/atlas/gpus/0/sharing",
            Some(r#"{"mode": "mps"}"#),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let html = page(&app, "/models").await;
    let row = |model: &str| {
        let start = html.find(&format!("data-model=\"{model}\"")).unwrap();
        let end = html[start..].find("</tr>").unwrap();
        html[start..start + end].to_owned()
    };
    assert!(row("glm-5.3").contains("enforced by MPS"), "{html}");
    assert!(!row("vision").contains("enforced by MPS"), "{html}");
}

#[tokio::test]
async fn the_models_tab_lists_each_deployed_model_with_its_group() {
    let app = app().await;
    let html = page(&app, "/models").await;
    assert!(html.contains("No model runs yet"), "{html}");
    deploy(
        &app,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &app,
        json!({"model": "speech", "gpus": ["majin:0"], "shared": false}),
    )
    .await;
    let html = page(&app, "/models").await;
    for text in [
        "glm-5.3",
        "text-router",
        "40%",
        "1 whole GPU",
        "0/1 healthy",
    ] {
        assert!(html.contains(text), "{text} in {html}");
    }
}

#[tokio::test]
async fn a_deploy_from_the_wizard_is_judged_again_on_the_server() {
    let app = app().await;
    let request = |share: u32| {
        json!({"request": {
            "model": "glm-5.3", "shared": true,
            "gpus": [{"machine": "atlas", "index": 0}],
            "share": share, "shares": [], "revision": null,
            "serving": {"args": ["--max-model-len", "8192"], "env": [["VLLM_LOGGING_LEVEL", "INFO"]]}
        }})
    };
    let (status, body) = call_rpc(&app, "deploy_model", request(10_100)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["Refused"],
        "The shares add up to more than the accelerator holds."
    );
    let (_, groups) = app.get("/api/groups").await;
    assert_eq!(groups, json!([]), "nothing was committed");

    let (status, body) = call_rpc(&app, "deploy_model", request(4_000)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["group"], "text-router");
    assert_eq!(body["restarts"], json!(["glm-5.3"]));
    let (args, env) = app.fleet.serving_of("glm-5.3").unwrap();
    assert_eq!(args, ["--max-model-len", "8192"]);
    assert_eq!(env["VLLM_LOGGING_LEVEL"], "INFO");
}

#[tokio::test]
async fn a_share_change_names_its_revision_and_restarts_only_what_changed() {
    let app = app().await;
    deploy(
        &app,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &app,
        json!({"model": "speech", "gpus": ["atlas:0"], "share": 10, "revision": 1}),
    )
    .await;
    let (status, form) = call_rpc(&app, "load_sharing_form", json!({"model": "speech"})).await;
    assert_eq!(status, StatusCode::OK, "{form}");
    assert_eq!(form["group"]["revision"], 2);
    let shares = |glm: u32| json!([["glm-5.3", glm], ["speech", 1000]]);
    let (status, body) = call_rpc(
        &app,
        "save_shares",
        json!({"group": "text-router", "revision": 1, "shares": shares(3000)}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = call_rpc(
        &app,
        "save_shares",
        json!({"group": "text-router", "revision": 2, "shares": shares(3000)}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["restarts"], json!(["glm-5.3"]));
}

#[tokio::test]
async fn the_router_keeps_its_committed_share_whatever_the_browser_sends() {
    let app = app().await;
    deploy(
        &app,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &app,
        json!({"model": "semantic-router", "gpus": ["atlas:0"], "share": 10, "revision": 1}),
    )
    .await;
    let (status, body) = call_rpc(
        &app,
        "save_shares",
        json!({"group": "text-router", "revision": 2, "shares": [["glm-5.3", 4000], ["semantic-router", 500]]}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        body["Refused"],
        "the share of semantic-router is not editable"
    );
    let (_, group) = app.get("/api/groups/text-router").await;
    assert_eq!(group["revision"], 2, "nothing changed");
}

#[tokio::test]
async fn the_serving_form_shows_a_secret_to_admins_only() {
    let app = app().await;
    deploy(
        &app,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "env": {"HF_TOKEN": "hf_formsecret"}}),
    )
    .await;
    let user = json!({"name": "otto", "role": "operator", "password": "twelve chars!"});
    app.call(Method::POST, "/api/users", Some(&user.to_string()))
        .await;
    let (_, token) = app
        .call(
            Method::POST,
            "/api/tokens",
            Some(&json!({"name": "script", "user": "otto"}).to_string()),
        )
        .await;
    let operator = token["secret"].as_str().unwrap();
    let form = json!({"model": "glm-5.3"}).to_string();
    let (status, seen) = app
        .call_with(
            Some(operator),
            Method::POST,
            "/rpc/load_serving_form",
            Some(&form),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["serving"]["env"], json!([["HF_TOKEN", "(secret)"]]));
    let (_, seen) = call_rpc(&app, "load_serving_form", json!({"model": "glm-5.3"})).await;
    assert_eq!(
        seen["serving"]["env"],
        json!([["HF_TOKEN", "hf_formsecret"]])
    );
}

#[tokio::test]
async fn the_wizards_estimate_says_why_a_model_has_none() {
    let app = app().await;
    let query = json!({"query": {"model": "speech", "machine": "atlas", "context": null, "slots": 1, "cache_type": "f16"}});
    let (status, answer) = call_rpc(&app, "estimate_model", query).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer,
        json!({"NotEstimated": "models/speech.gguf does not exist on this machine"})
    );
    let query = json!({"query": {"model": "nothing", "machine": null, "context": null, "slots": 1, "cache_type": "f16"}});
    let (status, _) = call_rpc(&app, "estimate_model", query).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_overview_sums_the_fleet_counts_the_models_and_raises_an_alarm_that_leads_to_where_it_is_dealt_with(
) {
    let app = app().await;
    deploy(
        &app,
        json!({"model": "speech", "gpus": ["atlas:0"], "share": 10}),
    )
    .await;
    // speech's engine measured at 11 GB of its 9.6 GB share: a promise broken.
    let mut reading = crate::inventory::GpuLive {
        index: 0,
        utilisation_percent: 10,
        power_mw: None,
        temperature_c: None,
        energy_mj: None,
        used: placement::Bytes::gb(11),
        processes: vec![(777, placement::Bytes::gb(11))],
        problem: None,
    };
    let running = vec![("group:speech/speech@atlas".to_owned(), vec![777])];
    app.fleet
        .measure("atlas", &[reading.clone()], &running, &[]);
    let (status, o) = call_rpc(&app, "load_overview", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{o}");
    // majin (8 GB) and atlas (two of 96 GB).
    assert_eq!(
        (o["machines"].as_u64(), o["gpus"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(o["free_gpus"], 2);
    let gb = |v: &Value| v.as_u64().unwrap() as f64 / f64::from(1u32 << 30);
    assert!((gb(&o["shared"]) - 9.6).abs() < 0.01, "{o}");
    assert!(
        (gb(&o["stranded"]) - 86.4).abs() < 0.01,
        "the rest of atlas:0: {o}"
    );
    assert_eq!(o["models"], 1);
    let alarms = o["alarms"].as_array().unwrap();
    assert_eq!(alarms.len(), 2, "{o}");
    // atlas has no agent here: speech cannot run there, and says so, neither loading nor calm.
    let no_agent = json!({"kind": "stopped", "href": "/models/speech",
        "line": "speech's engine on atlas is stopped: atlas is not this machine, and Tessera has no agent there to start engines with"});
    assert_eq!(alarms[0], no_agent);
    assert_eq!(
        (o["loading"].as_u64(), o["failing"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(alarms[1]["kind"], "over_share");
    assert_eq!(alarms[1]["href"], "/machines/atlas");
    assert!(alarms[1]["line"]
        .as_str()
        .unwrap()
        .starts_with("speech uses 11 GB on GPU 0 of atlas"));

    // Back within its share, the alarm goes.
    reading.processes = vec![(777, placement::Bytes::gb(9))];
    app.fleet.measure("atlas", &[reading], &running, &[]);
    let (_, o) = call_rpc(&app, "load_overview", json!({})).await;
    assert_eq!(o["alarms"], json!([no_agent]));
    let page = page(&app, "/").await;
    assert!(
        page.contains("Tessera has no agent there to start engines with")
            && !page.contains("No alarms."),
        "the page itself"
    );
}

#[tokio::test]
async fn a_ray_cluster_that_does_not_answer_is_the_overview_s_first_alarm_with_why_until_it_answers(
) {
    let app = TestApp::new(MAJIN).await;
    let (_, o) = call_rpc(&app, "load_overview", json!({})).await;
    assert_eq!(o["alarms"], json!([]), "no cluster, no alarm");
    app.fleet.cluster_answered(Err(
        "the Ray cluster at http://10.0.0.9:8265 does not answer".into(),
    ));
    let (_, o) = call_rpc(&app, "load_overview", json!({})).await;
    let alarms = o["alarms"].as_array().unwrap();
    assert_eq!(alarms.len(), 1, "{o}");
    assert_eq!(alarms[0]["kind"], "cluster_down");
    assert_eq!(alarms[0]["href"], "/nodes");
    let line = alarms[0]["line"].as_str().unwrap();
    assert!(
        line.starts_with("The Ray cluster does not answer since ")
            && line.contains(": the Ray cluster at http://10.0.0.9:8265 does not answer. ")
            && line.ends_with("nothing starts or stops there until it answers."),
        "{line}"
    );
    assert!(
        page(&app, "/").await.contains("Cluster down"),
        "the page itself"
    );
    app.fleet.cluster_answered(Ok(()));
    let (_, o) = call_rpc(&app, "load_overview", json!({})).await;
    assert_eq!(o["alarms"], json!([]));
}

#[tokio::test]
async fn a_worker_that_waits_for_room_is_an_alarm_with_its_reason_until_it_is_placed() {
    let app = TestApp::new(MAJIN).await;
    // majin's one GPU offers 7 GB to shared work: the second 6 GB worker waits for the first.
    for name in ["first", "second"] {
        let (status, w) = app.post_worker(&shared_worker(name, 6.0)).await;
        assert_eq!(status, StatusCode::CREATED, "{w}");
    }
    let (_, o) = call_rpc(&app, "load_overview", json!({})).await;
    let alarms = o["alarms"].as_array().unwrap();
    assert_eq!(alarms.len(), 1, "{o}");
    assert_eq!(alarms[0]["kind"], "waiting");
    assert_eq!(alarms[0]["href"], "/nodes");
    assert_eq!(
        alarms[0]["line"],
        "second waits for room: GPU 0 of majin: 6 of 7 GB taken by shared work; it needs 6"
    );
    assert!(page(&app, "/").await.contains("second waits for room"));

    let (status, _) = app.call(Method::DELETE, "/api/workers/first", None).await;
    assert!(status.is_success(), "{status}");
    assert_eq!(app.get("/api/workers/second").await.1["state"], "placed");
    let (_, o) = call_rpc(&app, "load_overview", json!({})).await;
    assert_eq!(o["alarms"], json!([]));
}
