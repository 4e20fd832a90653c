use crate::testing::{atlas_here_with_catalog, majin_and_node, TestApp, ATLAS, MAJIN};
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

/// A shared worker of `gb` pinned to GPU `gpu` (`machine:index`).
fn pinned(name: &str, gb: f64, gpu: &str) -> String {
    json!({
        "name": name,
        "requested_resources": { "gpu_requests": { "count": 1, "shared": true, "memory_gb": gb, "ids": [gpu] } }
    })
    .to_string()
}

async fn set(app: &TestApp, gpu: &str, body: Value) -> (StatusCode, Value) {
    let (machine, index) = gpu.split_once(':').unwrap();
    app.call(
        Method::PUT,
        &format!("/api/machines/{machine}/gpus/{index}/sharing"),
        Some(&body.to_string()),
    )
    .await
}

/// The engines the committed state runs, by unit, each said to be an MPS client or not.
async fn engines(app: &TestApp) -> Vec<(String, bool)> {
    let mut list: Vec<(String, bool)> = app
        .fleet
        .desired()
        .await
        .into_iter()
        .map(|spec| (spec.unit.clone(), spec.mps.is_some()))
        .collect();
    list.sort();
    list
}

#[tokio::test]
async fn switching_a_gpu_to_mps_restarts_exactly_its_sharers_as_its_clients_and_back_again() {
    let app = TestApp::with_local(&majin_and_node(), Some("node")).await;
    for (name, gb, gpu) in [
        ("embed", 3.0, "node:0"),
        ("chat", 10.0, "node:0"),
        ("other", 4.0, "node:1"),
    ] {
        let (status, body) = app.post_worker(&pinned(name, gb, gpu)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (status, change) = set(
        &app,
        "node:0",
        json!({"mode": "mps", "compute_percent": 50}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{change}");
    assert_eq!(
        change,
        json!({"gpu": "node:0", "sharing": {"mode": "mps", "compute_percent": 50}, "restarts": ["chat", "embed"]})
    );
    assert_eq!(
        engines(&app).await,
        [
            ("chat".to_owned(), true),
            ("embed".to_owned(), true),
            ("other".to_owned(), false)
        ]
    );
    let (_, node) = app.get("/api/machines/node").await;
    assert_eq!(
        node["gpus"][0]["sharing"],
        json!({"mode": "mps", "compute_percent": 50})
    );
    assert_eq!(node["gpus"][1]["sharing"], json!({"mode": "time-slicing"}));
    let (_, log) = app.get("/api/audit?action=gpu.sharing").await;
    assert_eq!(log[0]["target"], "node:0", "{log}");
    assert_eq!(log[0]["before"], json!({"mode": "time-slicing"}));
    assert_eq!(log[0]["restarts"], json!(["chat", "embed"]));

    // The same again changes nothing; back to time-slicing restarts the two again.
    let (_, again) = set(
        &app,
        "node:0",
        json!({"mode": "mps", "compute_percent": 50}),
    )
    .await;
    assert_eq!(again["restarts"], json!([]));
    let (_, back) = set(&app, "node:0", json!({"mode": "time-slicing"})).await;
    assert_eq!(back["restarts"], json!(["chat", "embed"]));
    assert!(engines(&app).await.iter().all(|(_, mps)| !mps));
    app.fleet.check_ledger().await.unwrap();

    // What is set outlives the server.
    set(&app, "node:1", json!({"mode": "mps"})).await;
    let app = app.restart().await;
    let (_, node) = app.get("/api/machines/node").await;
    assert_eq!(node["gpus"][1]["sharing"], json!({"mode": "mps"}));
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn an_mps_gpu_turns_its_49th_engine_elsewhere_and_a_gpu_with_49_cannot_become_mps() {
    let app = TestApp::with_local(&majin_and_node(), Some("node")).await;
    set(&app, "node:0", json!({"mode": "mps"})).await;
    for i in 0..48 {
        let (status, body) = app
            .post_worker(&pinned(&format!("e{i}"), 0.25, "node:0"))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["state"], "placed", "{body}");
    }
    let (_, body) = app.post_worker(&pinned("e48", 0.25, "node:0")).await;
    assert_eq!(body["state"], "pending", "{body}");
    assert_eq!(
        body["pending_reasons"],
        json!(["GPU 0 of node runs MPS, whose server takes at most 48 engines, and has that many"])
    );
    // Time-sliced, the 49th fits; then the GPU cannot go back to MPS while it has 49.
    let (_, back) = set(&app, "node:0", json!({"mode": "time-slicing"})).await;
    assert_eq!(back["restarts"].as_array().map(Vec::len), Some(48));
    let (_, e48) = app.get("/api/workers/e48").await;
    assert_eq!(e48["state"], "placed", "{e48}");
    let (status, body) = set(&app, "node:0", json!({"mode": "mps"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        body["error"],
        "an MPS server takes at most 48 clients per GPU; GPU 0 of node would have 49: move some work off it first"
    );
    let (_, node) = app.get("/api/machines/node").await;
    assert_eq!(
        node["gpus"][0]["sharing"],
        json!({"mode": "time-slicing"}),
        "nothing was stored"
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_group_on_several_gpus_keeps_them_off_mps_and_an_mps_gpu_keeps_it_off() {
    let app = atlas_here_with_catalog().await;
    let why = "glm-5.3 runs on several GPUs, and under MPS an engine runs on one: GPU 1 of atlas cannot run MPS while glm-5.3 shares it";
    let across = json!({"model": "glm-5.3", "gpus": ["atlas:0", "atlas:1"], "share": 40});
    let (status, _) = set(&app, "atlas:1", json!({"mode": "mps"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app.deploy(across.clone()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some(why))
    );
    assert_eq!(
        app.get("/api/groups").await.1,
        json!([]),
        "nothing was deployed"
    );

    set(&app, "atlas:1", json!({"mode": "time-slicing"})).await;
    let (status, change) = app.deploy(across).await;
    assert_eq!(status, StatusCode::CREATED, "{change}");
    let (status, body) = set(&app, "atlas:1", json!({"mode": "mps"})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some(why))
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_sharing_setting_that_cannot_hold_is_refused_with_what_to_do_and_nothing_is_stored() {
    let app = TestApp::with_local(&format!("{MAJIN}{ATLAS}"), Some("atlas")).await;
    let cases = [
        ("majin:0", json!({"mode": "mps"}), StatusCode::UNPROCESSABLE_ENTITY,
            "GPU 0 of majin is on majin, where Tessera cannot run an MPS daemon: MPS is set on this server's own GPUs and the Ray cluster's nodes (and the demo fleet's)"),
        ("atlas:0", json!({"mode": "mig"}), StatusCode::UNPROCESSABLE_ENTITY,
            "Tessera plans MIG layouts but does not apply them yet: the machine page shows GPU 0 of atlas's layout and the nvidia-smi commands that make it"),
        ("atlas:0", json!({"mode": "vgpu"}), StatusCode::UNPROCESSABLE_ENTITY,
            "choose time-slicing, mps or mig, not \"vgpu\""),
        ("atlas:0", json!({"mode": "mps", "compute_percent": 0}), StatusCode::UNPROCESSABLE_ENTITY,
            "a compute share is a whole percent from 1 to 100, not 0"),
        ("atlas:0", json!({"mode": "time-slicing", "compute_percent": 30}), StatusCode::UNPROCESSABLE_ENTITY,
            "a compute share applies under MPS only: choose mps, or leave compute_percent out"),
        ("atlas:7", json!({"mode": "mps"}), StatusCode::NOT_FOUND,
            "there is no GPU 7 of atlas; GET /api/machines lists the GPUs"),
        ("atlas:x", json!({"mode": "mps"}), StatusCode::BAD_REQUEST,
            "a GPU is named by its index on the machine, such as /api/machines/atlas/gpus/0/sharing, not \"x\""),
    ];
    for (gpu, body, status, error) in cases {
        let (got, answer) = set(&app, gpu, body.clone()).await;
        assert_eq!(
            (got, answer["error"].as_str()),
            (status, Some(error)),
            "{gpu} {body}"
        );
    }
    let (_, machines) = app.get("/api/machines").await;
    for machine in machines.as_array().unwrap() {
        for gpu in machine["gpus"].as_array().unwrap() {
            assert_eq!(gpu["sharing"], json!({"mode": "time-slicing"}));
        }
    }
    let (_, log) = app.get("/api/audit?action=gpu.sharing").await;
    assert_eq!(log, json!([]));
}

#[tokio::test]
async fn a_sharing_broken_before_a_write_is_said_and_refuses_only_what_breaks_it_further() {
    let app = atlas_here_with_catalog().await;
    let (status, _) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["atlas:0", "atlas:1"], "share": 40}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    // Written behind the server's back (as an older server or a hand might): GPU 1 under MPS while a group
    // spans it. The server opens on it all the same.
    sqlx::query("INSERT INTO gpu_sharing (machine, gpu_index, mode) VALUES ('atlas', 1, 'mps')")
        .execute(&app.pool)
        .await
        .unwrap();
    let app = app.restart().await;
    let (status, body) = app.post_worker(&pinned("other", 2.0, "majin:0")).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "an unrelated write goes through: {body}"
    );
    let (status, body) = app
        .deploy(
            json!({"model": "vision", "gpus": ["atlas:0", "atlas:1"], "share": 10, "revision": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        body["error"],
        "glm-5.3, vision run on several GPUs, and under MPS an engine runs on one: GPU 1 of atlas cannot run MPS while glm-5.3, vision share it"
    );
    app.fleet.check_ledger().await.unwrap();
}
