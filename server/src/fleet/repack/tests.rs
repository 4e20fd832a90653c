use crate::testing::{majin_and_atlas_with_catalog, majin_and_node, shared_worker, TestApp, MAJIN};
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

/// Waits, a bounded while, for the repack to end; its last state.
async fn ended(app: &TestApp) -> Value {
    for _ in 0..500 {
        let (status, run) = app.get("/api/repack/run").await;
        assert_eq!(status, StatusCode::OK, "{run}");
        if run["state"] != "running" {
            return run;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the repack never ended");
}

fn gpu(machine: &str, index: u32) -> Value {
    json!({ "machine": machine, "index": index })
}

/// The node's two 24 GB GPUs each hold one small worker: `embed` (3 GB) on GPU 0, `chat` (10 GB) on GPU 1,
/// as best fit left them once a large worker ended.
async fn fragmented() -> TestApp {
    let app = TestApp::new(&majin_and_node()).await;
    for (name, gb) in [("big", 20.0), ("chat", 10.0), ("embed", 3.0)] {
        let (status, body) = app.post_worker(&shared_worker(name, gb)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (_, embed) = app.get("/api/workers/embed").await;
    assert_eq!(
        (&embed["machine"], &embed["gpus"]),
        (&json!("node"), &json!([0]))
    );
    let (status, _) = app.call(Method::DELETE, "/api/workers/big", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    app
}

#[tokio::test]
async fn a_repack_carried_out_frees_the_gpus_it_promised_and_the_ledger_agrees_with_what_moved() {
    let app = fragmented().await;
    let (status, plan) = app.get("/api/repack").await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    assert_eq!(plan["freed"], json!([gpu("node", 0)]), "{plan}");
    assert_eq!(plan["restarts"], 1);
    assert_eq!(plan["moves"][0]["unit"], "embed");
    let (status, run) = app
        .call(
            Method::POST,
            "/api/repack",
            Some(&json!({ "expect": plan["moves"] }).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    let run = ended(&app).await;
    assert_eq!(run["state"], "done", "{run}");
    assert_eq!(run["steps"][0]["status"], "done");
    let (_, embed) = app.get("/api/workers/embed").await;
    assert_eq!(
        (&embed["machine"], &embed["gpus"]),
        (&json!("node"), &json!([1]))
    );
    let (_, node) = app.get("/api/machines/node").await;
    assert_eq!(node["gpus"][0]["sharers"], json!([]), "{node}");
    app.fleet.check_ledger().await.unwrap();
    let (_, audit) = app.get("/api/audit?action=repack.move&target=embed").await;
    assert_eq!(audit.as_array().map(Vec::len), Some(1), "{audit}");
    // Nothing is left to free: a second repack moves nothing.
    let (status, body) = app.call(Method::POST, "/api/repack", Some("{}")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"], "this repack moves nothing and frees no GPU");
}

#[tokio::test]
async fn a_worker_whose_gpu_left_the_inventory_stays_out_of_a_repack_and_the_rest_of_the_fleet_still_repacks(
) {
    let app = fragmented().await;
    let pinned = json!({"name": "desk", "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 2, "ids": ["majin:0"]}}});
    let (status, body) = app.post_worker(&pinned.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let majin = crate::inventory::file::parse_inventory(MAJIN)
        .unwrap()
        .remove(0);
    app.fleet
        .refresh_machine(placement::Machine {
            gpus: Vec::new(),
            ..majin
        })
        .await
        .unwrap();
    let (status, plan) = app.get("/api/repack").await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    assert_eq!(plan["freed"], json!([gpu("node", 0)]), "{plan}");
    let units: Vec<&Value> = plan["moves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["unit"])
        .collect();
    assert_eq!(units, [&json!("embed")], "{plan}");
}

#[tokio::test]
async fn a_repack_started_against_a_plan_the_fleet_no_longer_matches_is_refused_and_nothing_moves()
{
    let app = fragmented().await;
    let (_, plan) = app.get("/api/repack").await;
    let (status, _) = app.post_worker(&shared_worker("late", 12.0)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = app
        .call(
            Method::POST,
            "/api/repack",
            Some(&json!({ "expect": plan["moves"] }).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        body["error"],
        "the fleet changed since this repack was planned; look at the new plan and start it again"
    );
    let (_, embed) = app.get("/api/workers/embed").await;
    assert_eq!(embed["gpus"], json!([0]));
    assert_eq!(app.get("/api/repack/run").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn asked_to_free_more_gpus_than_memory_allows_the_repack_says_how_many_it_can() {
    let app = fragmented().await;
    let (status, body) = app.get("/api/repack?free=3").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        body["error"],
        "No repack frees 3 GPUs: by memory, at most 1 can be freed."
    );
    let (status, body) = app.get("/api/repack?free=two").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"],
        "free must be a whole number of GPUs, such as ?free=1, not \"two\""
    );
    let (status, body) = app.call(Method::POST, "/api/repack/stop", None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "no repack is being carried out");
}

#[tokio::test]
async fn a_sharing_group_moves_whole_to_a_gpu_of_its_size_and_its_old_gpu_is_free() {
    let app = majin_and_atlas_with_catalog().await;
    let (status, body) = app
        .deploy(json!({"model": "speech", "gpus": ["atlas:0"], "share": 20}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let pinned = json!({
        "name": "pinned",
        "requested_resources": { "gpu_requests": { "count": 1, "shared": true, "memory_gb": 30, "ids": ["atlas:1"] } }
    });
    let (status, body) = app.post_worker(&pinned.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, plan) = app.get("/api/repack").await;
    assert_eq!(plan["moves"][0]["unit"], "speech", "{plan}");
    assert_eq!(plan["moves"][0]["to"], gpu("atlas", 1));
    let (status, run) = app.call(Method::POST, "/api/repack", Some("{}")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    assert_eq!(ended(&app).await["state"], "done");
    let (_, group) = app.get("/api/groups/speech").await;
    assert_eq!(group["gpus"], json!(["atlas:1"]), "{group}");
    let (_, atlas) = app.get("/api/machines/atlas").await;
    assert_eq!(atlas["gpus"][0]["sharers"], json!([]), "{atlas}");
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn work_on_a_machine_without_a_second_gpu_has_nowhere_to_go_and_the_plan_moves_nothing() {
    let app = TestApp::new(MAJIN).await;
    let (status, _) = app.post_worker(&shared_worker("solo", 2.0)).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, plan) = app.get("/api/repack").await;
    assert_eq!(plan["moves"], json!([]));
    assert_eq!(plan["most"], 0);
}

#[tokio::test]
async fn the_repack_page_is_sent_the_plan_that_frees_the_most_so_that_the_browser_need_not_work_it_out_again(
) {
    let app = fragmented().await;
    let preview = app.fleet.repack_preview().await;
    let (status, plan) = app.get("/api/repack").await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    let most = preview.most.expect("a plan");
    assert_eq!(serde_json::to_value(&most).unwrap(), plan);
    // The fleet it came from, for the asks the browser plans itself.
    assert_eq!(preview.input, app.fleet.repack_input().await);
    assert_eq!(
        preview.input.plan(placement::repack::Goal::Most).unwrap(),
        most
    );
}
