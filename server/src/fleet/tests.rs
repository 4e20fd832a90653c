//! The fleet's promise, that the ledger never disagrees with what was committed: one test per fault that
//! broke it, each named as what it proves, then a model-based test of random sequences of writes,
//! readings, restarts and cancelled requests.

use crate::inventory::file::parse_inventory;
use crate::testing::{majin_and_atlas_with_catalog, shared_worker, TestApp, ATLAS, MAJIN};
use axum::http::{Method, StatusCode};
use futures::FutureExt;
use placement::{Bytes, GpuRef};
use serde_json::{json, Value};

/// A shared worker of `gb` on majin's GPU.
fn on_majin(name: &str, gb: f64) -> String {
    json!({
        "name": name,
        "requested_resources": { "gpu_requests": { "count": 1, "shared": true, "memory_gb": gb, "ids": ["majin:0"] } }
    })
    .to_string()
}

/// Waits, a bounded while, for a write whose request was dropped to finish on its own.
async fn eventually(app: &TestApp, uri: &str, status: StatusCode) {
    for _ in 0..200 {
        if app.get(uri).await.0 == status {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{uri} never answered {status}");
}

/// `model`'s entry among the members of the groups listed.
fn member<'a>(groups: &'a Value, model: &str) -> &'a Value {
    groups
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["members"].as_array().into_iter().flatten())
        .find(|m| m["name"] == model)
        .unwrap_or_else(|| panic!("{model} is in no group: {groups}"))
}

/// majin as read again with `held_outside_gb` held outside Tessera.
pub(super) fn majin_holding(gb: u64) -> placement::Machine {
    let mut majin = parse_inventory(MAJIN).unwrap().remove(0);
    majin.gpus[0].held_outside = Bytes::gb(gb);
    majin
}

/// atlas with only its GPU 0: GPU 1 has left the inventory.
pub(super) fn atlas_without_gpu_1() -> String {
    ATLAS
        .split("[[machine.gpu]]")
        .take(2)
        .collect::<Vec<_>>()
        .join("[[machine.gpu]]")
}

#[tokio::test]
async fn a_group_member_that_no_longer_fits_after_a_reading_stays_held_and_its_gpu_takes_no_new_work(
) {
    let app = majin_and_atlas_with_catalog().await;
    let (status, body) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["majin:0"], "share": 50}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // The desktop now holds 5 GB: the GPU offers 3, and glm-5.3 holds 4.
    app.fleet.refresh_machine(majin_holding(5)).await.unwrap();
    let (_, majin) = app.get("/api/machines/majin").await;
    let gpu = &majin["gpus"][0];
    assert_eq!(gpu["mode"], "shared");
    assert_eq!(gpu["taken_gb"], 4.0, "glm-5.3 still holds its share: {gpu}");
    assert_eq!(
        gpu["overcommitted"],
        "GPU 0 of majin offers 3 of its 8 GB (5 GB held outside Tessera) but its sharers take 4 GB: 1 GB over"
    );
    let (status, small) = app.post_worker(&on_majin("small", 0.5)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(small["state"], "pending", "{small}");
    let whole = json!({"name": "whole", "requested_resources": {"gpu_requests": {"count": 1, "ids": ["majin:0"]}}});
    let (_, whole) = app.post_worker(&whole.to_string()).await;
    assert_eq!(
        whole["state"], "pending",
        "a whole GPU never goes beside a running sharer: {whole}"
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn an_over_committed_gpu_stops_its_newest_shared_worker_first_and_never_a_group_member() {
    let app = majin_and_atlas_with_catalog().await;
    app.deploy(json!({"model": "glm-5.3", "gpus": ["majin:0"], "share": 25}))
        .await;
    app.post_worker(&on_majin("older", 2.0)).await;
    app.post_worker(&on_majin("newer", 2.0)).await;
    // Offers 4; glm-5.3 (2), older (2) and newer (2) take 6, for longer than --evict-after-s: newer
    // stops, and that is enough.
    app.fleet.refresh_machine(majin_holding(4)).await.unwrap();
    let majin0 = GpuRef::new("majin", 0);
    assert!(app.fleet.overcommitted_for(&majin0, EVICT_AFTER).await);
    app.fleet.refresh_machine(majin_holding(4)).await.unwrap();
    let (_, newer) = app.get("/api/workers/newer").await;
    assert_eq!(newer["state"], "pending");
    assert_eq!(
        newer["pending_reasons"],
        json!(["GPU 0 of majin: 4 of 4 GB taken by shared work; it needs 2"])
    );
    assert_eq!(app.get("/api/workers/older").await.1["state"], "placed");
    let (_, audit) = app.get("/api/audit?action=worker.evict").await;
    assert!(
        audit.to_string().contains("newer"),
        "said in the audit log: {audit}"
    );
    // Offers 1 for as long: older stops too; glm-5.3 stays, and the GPU says it is over.
    app.fleet.refresh_machine(majin_holding(7)).await.unwrap();
    assert!(app.fleet.overcommitted_for(&majin0, EVICT_AFTER).await);
    app.fleet.refresh_machine(majin_holding(7)).await.unwrap();
    assert_eq!(app.get("/api/workers/older").await.1["state"], "pending");
    let (_, groups) = app.get("/api/groups").await;
    assert_eq!(member(&groups, "glm-5.3")["share_percent"], 25.0);
    let (_, majin) = app.get("/api/machines/majin").await;
    assert!(majin["gpus"][0]["overcommitted"].is_string(), "{majin}");
    app.fleet.check_ledger().await.unwrap();
}

/// The default `--evict-after-s`, which the test servers keep.
pub(super) const EVICT_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

#[tokio::test]
async fn a_spike_of_another_programs_memory_stops_no_worker_and_keeps_new_work_off_the_gpu_while_it_lasts(
) {
    let app = majin_and_atlas_with_catalog().await;
    app.deploy(json!({"model": "glm-5.3", "gpus": ["majin:0"], "share": 25}))
        .await;
    app.post_worker(&on_majin("older", 2.0)).await;
    app.post_worker(&on_majin("newer", 2.0)).await;
    // Another program takes 4 GB for a few readings, under --evict-after-s.
    app.fleet.refresh_machine(majin_holding(4)).await.unwrap();
    app.fleet.refresh_machine(majin_holding(4)).await.unwrap();
    assert_eq!(app.get("/api/workers/newer").await.1["state"], "placed");
    let (_, audit) = app.get("/api/audit?action=worker.evict").await;
    assert_eq!(audit, json!([]));
    let (_, majin) = app.get("/api/machines/majin").await;
    assert!(majin["gpus"][0]["overcommitted"].is_string(), "{majin}");
    // No new work goes there meanwhile.
    let (_, small) = app.post_worker(&on_majin("small", 0.5)).await;
    assert_eq!(small["state"], "pending", "{small}");
    // The spike passes: nothing was stopped, and the waiting work is placed.
    app.fleet.refresh_machine(majin_holding(0)).await.unwrap();
    assert_eq!(app.get("/api/workers/small").await.1["state"], "placed");
    assert_eq!(app.get("/api/workers/newer").await.1["state"], "placed");
    // A new spike counts from its own start.
    app.fleet.refresh_machine(majin_holding(4)).await.unwrap();
    app.fleet.refresh_machine(majin_holding(4)).await.unwrap();
    assert_eq!(app.get("/api/workers/newer").await.1["state"], "placed");
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_group_whose_gpu_left_the_inventory_is_shown_not_held_and_the_server_starts() {
    let app = majin_and_atlas_with_catalog().await;
    let (status, _) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 40}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let app = app
        .restart_with(&format!("{MAJIN}{}", atlas_without_gpu_1()))
        .await;
    let (_, groups) = app.get("/api/groups").await;
    let glm = member(&groups, "glm-5.3");
    assert_eq!(
        glm["not_held"],
        json!(["GPU 1 of atlas is not in the inventory"])
    );
    // Nothing double-books what is left: atlas:0 is free, and takes new work.
    let (_, w) = app.post_worker(&shared_worker("w", 50.0)).await;
    assert_eq!(w["machine"], "atlas");
    assert_eq!(w["gpus"], json!([0]));
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_worker_kept_aside_whose_gpu_newer_work_took_waits_to_be_placed_again_and_a_restart_moves_nobody(
) {
    let app = majin_and_atlas_with_catalog().await;
    let whole = json!({"name": "pair", "requested_resources": {"gpu_requests": {"count": 2}}});
    let (_, pair) = app.post_worker(&whole.to_string()).await;
    assert_eq!(
        (&pair["machine"], &pair["gpus"]),
        (&json!("atlas"), &json!([0, 1]))
    );
    // atlas:1 leaves for a while; a group takes atlas:0 meanwhile, so pair is still kept aside once it is back.
    let atlas = |toml: &str| parse_inventory(toml).unwrap().remove(0);
    app.fleet
        .refresh_machine(atlas(&atlas_without_gpu_1()))
        .await
        .unwrap();
    let (status, _) = app
        .deploy(json!({"model": "speech", "gpus": ["atlas:0"], "share": 10}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    app.fleet.refresh_machine(atlas(ATLAS)).await.unwrap();
    // Newer work goes to atlas:1, which pair claims but does not hold.
    let pinned = json!({"name": "newer", "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 10, "ids": ["atlas:1"]}}});
    let (status, newer) = app.post_worker(&pinned.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{newer}");
    assert_eq!(newer["gpus"], json!([1]));
    // The group ends: atlas:0 is free, but atlas:1 is newer's now.
    let (_, groups) = app.get("/api/groups").await;
    let revision = groups[0]["revision"].as_i64().unwrap();
    let (status, _) = app
        .call(
            Method::DELETE,
            &format!("/api/deployments/speech?revision={revision}"),
            None,
        )
        .await;
    assert!(status.is_success(), "{status}");
    app.fleet.check_ledger().await.unwrap();
    let (_, pair) = app.get("/api/workers/pair").await;
    assert_eq!(pair["state"], "pending", "{pair}");
    // A restart holds what ran before it: newer stays where it is.
    let app = app.restart().await;
    app.fleet.check_ledger().await.unwrap();
    let (_, newer) = app.get("/api/workers/newer").await;
    assert_eq!(
        (&newer["state"], &newer["not_held"]),
        (&json!("placed"), &Value::Null),
        "{newer}"
    );
}

#[tokio::test]
async fn a_write_whose_request_is_dropped_half_way_still_commits_whole_and_the_ledger_follows() {
    let app = TestApp::new(MAJIN).await;
    let new = serde_json::from_str::<crate::api::NewWorkerBody>(&shared_worker("dropped", 2.0))
        .unwrap()
        .parse()
        .unwrap();
    // One poll starts the write; the request is then gone, as when its client disconnects.
    assert!(app
        .fleet
        .create_worker(new, &crate::testing::admin())
        .now_or_never()
        .is_none());
    eventually(&app, "/api/workers/dropped", StatusCode::OK).await;
    app.fleet.check_ledger().await.unwrap();
    let (_, majin) = app.get("/api/machines/majin").await;
    assert_eq!(majin["gpus"][0]["taken_gb"], 2.0);
    assert_eq!(app.get("/api/workers/dropped").await.1["state"], "placed");
    assert!(app
        .fleet
        .delete_worker("dropped", None, "ada")
        .now_or_never()
        .is_none());
    eventually(&app, "/api/workers/dropped", StatusCode::NOT_FOUND).await;
    app.fleet.check_ledger().await.unwrap();
    assert_eq!(
        app.get("/api/machines/majin").await.1["gpus"][0]["taken_gb"],
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_while_writes_go_on_reads_the_database_as_it_was_when_it_began_and_finds_nothing_differs(
) {
    let app = std::sync::Arc::new(TestApp::new(MAJIN).await);
    let writes = tokio::spawn({
        let app = app.clone();
        async move {
            for n in 0..60 {
                let name = format!("w{n}");
                let (status, answer) = app.post_worker(&shared_worker(&name, 0.25)).await;
                assert_eq!(status, StatusCode::CREATED, "{answer}");
                if n % 3 == 0 {
                    let (status, answer) = app
                        .call(Method::DELETE, &format!("/api/workers/{name}"), None)
                        .await;
                    assert_eq!(status, StatusCode::NO_CONTENT, "{answer}");
                }
            }
        }
    });
    let mut checks = 0;
    while !writes.is_finished() {
        app.fleet.check_ledger().await.unwrap();
        checks += 1;
    }
    writes.await.unwrap();
    app.fleet.check_ledger().await.unwrap();
    assert!(checks > 1, "the checks ran beside the writes: {checks}");
}

#[tokio::test]
async fn a_model_runs_in_a_group_or_on_whole_gpus_never_both() {
    let app = majin_and_atlas_with_catalog().await;
    app.deploy(json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}))
        .await;
    let (status, body) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["atlas:1"], "shared": false}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "glm-5.3 runs in group text-router already");
    app.deploy(json!({"model": "vision", "gpus": ["atlas:1"], "shared": false}))
        .await;
    let (status, body) = app
        .deploy(json!({"model": "vision", "gpus": ["majin:0"], "share": 10}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"], "vision runs on whole GPUs of atlas already");
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_model_s_own_answer_shows_how_it_runs_in_a_group_or_on_whole_gpus_and_no_other_model_s() {
    let app = majin_and_atlas_with_catalog().await;
    app.deploy(json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}))
        .await;
    app.deploy(json!({"model": "vision", "gpus": ["atlas:1"], "shared": false}))
        .await;
    let (status, glm) = app.get("/api/models/glm-5.3").await;
    assert_eq!(status, StatusCode::OK, "{glm}");
    assert_eq!(glm["deployed"]["name"], "glm-5.3", "{glm}");
    assert_eq!(glm["deployed"]["share"], 4000, "{glm}");
    assert!(glm["deployed"]["group"].is_string(), "{glm}");
    let (status, vision) = app.get("/api/models/vision").await;
    assert_eq!(status, StatusCode::OK, "{vision}");
    assert_eq!(vision["deployed"]["name"], "vision", "{vision}");
    assert_eq!(vision["deployed"]["whole_gpus"], 1, "{vision}");
    assert_eq!(vision["deployed"]["group"], Value::Null, "{vision}");
    let (_, speech) = app.get("/api/models/speech").await;
    assert_eq!(speech["deployed"], Value::Null, "{speech}");
}

#[tokio::test]
async fn a_gpu_named_twice_in_a_deploy_is_refused_and_nothing_is_held() {
    let app = majin_and_atlas_with_catalog().await;
    for gpus in [
        json!(["atlas:0", "atlas:0"]),
        json!(["atlas:0", "atlas:00"]),
    ] {
        let (status, body) = app
            .deploy(json!({"model": "glm-5.3", "gpus": gpus, "share": 40}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .ends_with("list each GPU once"),
            "{body}"
        );
    }
    assert_eq!(app.get("/api/groups").await.1, json!([]));
    assert_eq!(
        app.get("/api/machines/atlas").await.1["gpus"][0]["mode"],
        "free"
    );
}

#[tokio::test]
async fn a_group_on_a_wsl2_machine_holds_its_share_on_every_gpu_there() {
    let studio = r#"
[[machine]]
name = "studio"
cpu_cores = 16
memory_gb = 64
all_gpus_visible = true
[[machine.gpu]]
index = 0
model = "NVIDIA RTX 4090"
memory_gb = 24
[[machine.gpu]]
index = 1
model = "NVIDIA RTX 4090"
memory_gb = 24
"#;
    let app = TestApp::new(studio).await;
    app.fleet
        .seed_catalog(&crate::inventory::demo::demo_catalog())
        .await
        .unwrap();
    let (status, body) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["studio:0"], "share": 50}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, machine) = app.get("/api/machines/studio").await;
    for gpu in machine["gpus"].as_array().unwrap() {
        assert_eq!(gpu["taken_gb"], 12.0, "{gpu}");
    }
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_gpu_without_readable_memory_or_unhealthy_takes_no_group() {
    let app = majin_and_atlas_with_catalog().await;
    let mut majin = majin_holding(1);
    majin.gpus[0].healthy = false;
    app.fleet.refresh_machine(majin.clone()).await.unwrap();
    let (status, body) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["majin:0"], "share": 10}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"], "GPU 0 of majin is unhealthy; choose another");
    majin.gpus[0].healthy = true;
    majin.gpus[0].total = Bytes::ZERO;
    majin.gpus[0].held_outside = Bytes::ZERO;
    app.fleet.refresh_machine(majin).await.unwrap();
    let (status, body) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["majin:0"], "share": 10}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("reports no memory"),
        "{body}"
    );
}

#[tokio::test]
async fn a_worker_that_fits_nowhere_in_a_large_fleet_lists_the_eight_gpus_with_the_most_room_and_says_there_are_more(
) {
    // Two machines of eight 16 GB GPUs, GPU i of each with i + 1 GB taken by a sharer.
    let mut toml = String::new();
    for machine in ["atlas", "boreas"] {
        toml.push_str(&format!(
            "[[machine]]\nname = \"{machine}\"\ncpu_cores = 64\nmemory_gb = 256\n"
        ));
        for index in 0..8 {
            toml.push_str(&format!(
                "[[machine.gpu]]\nindex = {index}\nuuid = \"GPU-{machine}-{index}\"\nmodel = \"L4\"\nmemory_gb = 16\n"
            ));
        }
    }
    let app = TestApp::new(&toml).await;
    for machine in ["atlas", "boreas"] {
        for index in 0..8 {
            let body = json!({"name": format!("{machine}-{index}"), "requested_resources": {"gpu_requests": {
                "count": 1, "shared": true, "memory_gb": index + 1, "ids": [format!("{machine}:{index}")]}}});
            let (status, _) = app.post_worker(&body.to_string()).await;
            assert_eq!(status, StatusCode::CREATED);
        }
    }
    let (_, big) = app.post_worker(&shared_worker("big", 15.5)).await;
    assert_eq!(big["state"], "pending");
    // Those with 1 to 4 GB taken, in the fleet's order; the other eight are not listed.
    let listed: Vec<String> = ["atlas", "boreas"]
        .iter()
        .flat_map(|m| {
            (0..4).map(move |i| {
                let taken = i + 1;
                format!("GPU {i} of {m}: {taken} of 16 GB taken by shared work; it needs 15.5")
            })
        })
        .chain(["and more GPUs or machines that cannot take it".to_owned()])
        .collect();
    assert_eq!(big["pending_reasons"], json!(listed), "{big}");
    // Room freed where it fits: placed by the write that freed it.
    let (status, _) = app
        .call(Method::DELETE, "/api/workers/boreas-0", None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, big) = app.get("/api/workers/big").await;
    assert_eq!(
        (&big["state"], &big["machine"]),
        (&json!("placed"), &json!("boreas")),
        "{big}"
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn shrinking_a_group_places_pending_work_that_now_fits() {
    let app = majin_and_atlas_with_catalog().await;
    let (_, change) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["majin:0"], "share": 80}))
        .await;
    let (_, w) = app.post_worker(&on_majin("w", 2.0)).await;
    assert_eq!(w["state"], "pending");
    let plan = json!({"revision": change["revision"], "shares": {"glm-5.3": 50}});
    let (status, body) = app
        .call(
            Method::PUT,
            "/api/groups/text-router/plan",
            Some(&plan.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(app.get("/api/workers/w").await.1["state"], "placed");
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn ending_a_group_places_pending_work_that_now_fits() {
    let app = majin_and_atlas_with_catalog().await;
    let (_, change) = app
        .deploy(json!({"model": "glm-5.3", "gpus": ["majin:0"], "share": 80}))
        .await;
    app.post_worker(&on_majin("w", 2.0)).await;
    let uri = format!("/api/deployments/glm-5.3?revision={}", change["revision"]);
    let (status, body) = app.call(Method::DELETE, &uri, None).await;
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(app.get("/api/workers/w").await.1["state"], "placed");
}

/// This machine's GPUs as NVML would report them: majin's GPU, 5 GB in use, 2 GB of it by `engine`'s
/// process; and what Tessera said its own engines are when it asked.
struct Nvml {
    engine: u32,
    asked: std::sync::Mutex<Vec<crate::inventory::Ours>>,
}

impl crate::inventory::LocalGpus for Nvml {
    fn read(
        &self,
        ours: &crate::inventory::Ours,
    ) -> Result<crate::inventory::LocalReading, crate::inventory::InventoryError> {
        self.asked.lock().unwrap().push(ours.clone());
        let mut machine = majin_holding(0);
        let processes = [(self.engine, Bytes::gb(2)), (1, Bytes::gb(3))];
        machine.gpus[0].held_outside =
            crate::inventory::held_outside(Bytes::gb(5), ours, 0, &processes);
        Ok(crate::inventory::LocalReading {
            machine,
            live: Vec::new(),
        })
    }
}

#[tokio::test]
async fn the_engines_a_crashed_server_left_running_are_tesseras_own_from_the_first_reading() {
    let dir = tempfile::tempdir().unwrap();
    let pool = crate::db::connect(None, dir.path()).await.unwrap();
    // An engine the previous server started and recorded in this boot, still running when this one starts.
    sqlx::query("INSERT INTO instance (id, token) VALUES (1, 'installation')")
        .execute(&pool)
        .await
        .unwrap();
    let mut engine = std::process::Command::new("sleep")
        .arg("30")
        .env(crate::runtime::process::INSTANCE_VAR, "installation")
        .spawn()
        .unwrap();
    let pid = engine.id();
    let ticks = crate::runtime::process::start_ticks(pid).unwrap();
    sqlx::query("INSERT INTO engines (unit, fingerprint, pid, start_ticks, port, boot_id) VALUES ('left', 'x', ?, ?, 1, ?)")
        .bind(i64::from(pid))
        .bind(ticks as i64)
        .bind(crate::runtime::process::boot_id())
        .execute(&pool)
        .await
        .unwrap();
    let settings =
        crate::runtime::Settings::new(std::env::current_exe().unwrap(), dir.path().join("engines"));
    let runtime = std::sync::Arc::new(
        crate::runtime::Runtime::open(pool.clone(), settings)
            .await
            .unwrap(),
    );
    let nvml = std::sync::Arc::new(Nvml {
        engine: pid,
        asked: Default::default(),
    });
    let hosts = crate::runtime::Hosts {
        local: Some("majin".to_owned()),
        ..Default::default()
    };
    let inventory = placement::Inventory::new(vec![majin_holding(5)]).unwrap();
    let fleet = super::Fleet::open(pool, inventory, Some(nvml.clone()), runtime, hosts)
        .await
        .unwrap();
    assert!(nvml.asked.lock().unwrap()[0].pids.contains(&pid));
    // 5 GB in use, 2 GB of it the engine's: 3 GB are held outside, not 5.
    let majin = fleet.machine("majin").unwrap();
    assert_eq!(majin.gpus[0].held_outside_gb, 3.0);
    let _ = engine.kill();
    let _ = engine.wait();
}

mod model;

#[tokio::test]
async fn a_write_that_panics_after_mending_the_ledger_in_place_leaves_it_as_what_is_committed() {
    let app = TestApp::new(MAJIN).await;
    let (status, body) = app
        .call(Method::POST, "/api/workers", Some(&on_majin("kept", 2.0)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let gpu = GpuRef::new("majin", 0);
    let before = app.fleet.state.try_lock().unwrap().ledger.holders_of(&gpu);
    assert_eq!(before.len(), 1, "{before:?}");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut state = app.fleet.state.try_lock().unwrap();
        let mend = super::Mend::new(&mut state);
        // A write's first row, mended in place, then a bug before it commits.
        mend.state.ledger.forget(&before[0]);
        assert!(mend.state.ledger.holders_of(&gpu).is_empty());
        panic!("a bug in the middle of a write");
    }));
    assert!(panicked.is_err());
    let state = app.fleet.state.try_lock().unwrap();
    assert_eq!(
        state.ledger.holders_of(&gpu),
        before,
        "built again from what is committed"
    );
}

#[tokio::test]
async fn the_check_names_a_waiting_worker_that_fits_now() {
    let app = TestApp::new(MAJIN).await;
    let (status, answer) = app.post_worker(&on_majin("big", 7.5)).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["state"], "pending", "{answer}");
    assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
    // Behind the fleet's back, its request shrinks to what fits: nothing placed it.
    let request: String = sqlx::query_scalar("SELECT request FROM workers WHERE name = 'big'")
        .fetch_one(&app.fleet.pool)
        .await
        .unwrap();
    fn shrink(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (key, value) in map.iter_mut() {
                    if key == "memory_gb" {
                        *value = json!(1);
                    } else {
                        shrink(value);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(shrink),
            _ => {}
        }
    }
    let mut smaller: Value = serde_json::from_str(&request).unwrap();
    shrink(&mut smaller);
    sqlx::query("UPDATE workers SET request = ? WHERE name = 'big'")
        .bind(smaller.to_string())
        .execute(&app.fleet.pool)
        .await
        .unwrap();
    let differ = app.fleet.check().await.unwrap();
    assert!(
        differ
            .iter()
            .any(|d| d == "worker big waits, though it fits now on majin (GPUs [0])"),
        "{differ:?}"
    );
}
