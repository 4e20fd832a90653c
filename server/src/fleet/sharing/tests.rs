use crate::testing::{
    atlas_here_with_catalog, majin_and_node, nvidia_smi_calls, stand_in_nvidia_smi, TestApp, ATLAS,
    HOPPER, MAJIN,
};
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
        ("atlas:0", json!({"mode": "mig", "instances": ["3g.40gb"]}), StatusCode::UNPROCESSABLE_ENTITY,
            "GPU 0 of atlas: NVIDIA RTX PRO 6000 has no MIG profiles Tessera knows: MIG runs on A100, H100 and H200."),
        ("atlas:0", json!({"mode": "mps", "instances": ["3g.40gb"]}), StatusCode::UNPROCESSABLE_ENTITY,
            "instances are named only with mode mig, such as {\"mode\": \"mig\", \"instances\": [\"3g.40gb\"]}"),
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

/// A worker holding GPU `gpu` (`machine:index`) whole.
fn whole(name: &str, gpu: &str) -> String {
    json!({
        "name": name,
        "command": "serve",
        "requested_resources": { "gpu_requests": { "count": 1, "shared": false, "ids": [gpu] } }
    })
    .to_string()
}

/// Sets `gpu` as `body` says while `worker` runs there, which is refused, then once it is removed; answers
/// what the second time answered.
async fn once_idle(app: &TestApp, gpu: &str, body: Value, worker: &str) -> Value {
    let (status, answer) = set(app, gpu, body.clone()).await;
    let named: placement::GpuRef = gpu.parse().unwrap();
    assert_eq!(
        (status, answer["error"].as_str().map(str::to_owned)),
        (StatusCode::CONFLICT, Some(format!("{named} runs {worker}: a GPU is cut into MIG instances, or joined back, only while nothing runs on it; remove or move it first")))
    );
    app.call(Method::DELETE, &format!("/api/workers/{worker}"), None)
        .await;
    // Its engine is let go at once, but stops in its own time (longer on a loaded machine): until then
    // the GPU is refused as not yet idle.
    let started = std::time::Instant::now();
    loop {
        let (status, change) = set(app, gpu, body.clone()).await;
        let stopping = change["error"]
            .as_str()
            .is_some_and(|e| e.contains("whose engine has not stopped yet"));
        if !stopping || started.elapsed() > std::time::Duration::from_secs(30) {
            assert_eq!(status, StatusCode::OK, "{change}");
            return change;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// What `CUDA_VISIBLE_DEVICES` the engine of `unit` is started with.
async fn cuda_devices(app: &TestApp, unit: &str) -> String {
    let spec = app
        .fleet
        .desired()
        .await
        .into_iter()
        .find(|s| s.unit == unit)
        .unwrap();
    let launch = spec.command_line(8001, placement::Bytes::gb(40)).unwrap();
    launch.env["CUDA_VISIBLE_DEVICES"].clone()
}

/// Each GPU of `machine` as the API lists it: index, MIG part and total bytes.
async fn gpus(app: &TestApp, machine: &str) -> Vec<(u64, Value, u64)> {
    let (_, m) = app.get(&format!("/api/machines/{machine}")).await;
    m["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["index"].as_u64().unwrap(),
                g.get("mig").cloned().unwrap_or(Value::Null),
                g["total_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_gpu_is_cut_into_mig_instances_each_held_whole_as_a_gpu_of_its_own_and_joined_back_only_while_idle(
) {
    let app = TestApp::made_up(HOPPER).await;
    let (status, _) = app.post_worker(&pinned("chat", 10.0, "hopper:0")).await;
    assert_eq!(status, StatusCode::CREATED);
    let cut = json!({"mode": "mig", "instances": ["3g.40gb", "2g.20gb", "1g.10gb"]});
    let change = once_idle(&app, "hopper:0", cut, "chat").await;
    assert_eq!(
        change,
        json!({"gpu": "hopper:0", "sharing": {"mode": "mig"}, "restarts": []})
    );
    let instance = |n: u64, profile: &str, mib: u64| {
        (
            1000 + n,
            json!({"role": "instance", "parent": 0, "profile": profile}),
            mib << 20,
        )
    };
    let cut_up = vec![
        (0, json!({"role": "cut"}), 80 << 30),
        (1, Value::Null, 80 << 30),
        instance(0, "3g.40gb", 40448),
        instance(1, "2g.20gb", 20096),
        instance(2, "1g.10gb", 9984),
    ];
    assert_eq!(gpus(&app, "hopper").await, cut_up);

    // Each instance takes one engine whole, which CUDA is told by the instance's UUID; a share goes to
    // the GPU left whole, and never onto the cut one or an instance.
    let (status, body) = app.post_worker(&whole("big", "hopper:1000")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["gpus"], json!([1000]), "{body}");
    let (_, body) = app.post_worker(&pinned("tiny", 1.0, "hopper:1001")).await;
    assert_eq!(
        body["pending_reasons"],
        json!(["MIG instance 1 of GPU 0 of hopper takes one engine whole; it asks for a share"])
    );
    let (_, body) = app.post_worker(&pinned("cut", 1.0, "hopper:0")).await;
    assert_eq!(
        body["pending_reasons"],
        json!(["GPU 0 of hopper is cut into MIG instances: work runs in those"])
    );
    assert_eq!(cuda_devices(&app, "big").await, "MIG-0a1b-0");
    // For usage, an hour of the instance is its memory's part of a GPU-hour, not a whole one.
    let (held, total): (i64, i64) = sqlx::query_as(
        "SELECT held_bytes, gpu_total_bytes FROM holdings WHERE holder = 'big' AND end_ms IS NULL",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((held, total), (40448 << 20, 80 << 30));

    // The instance's own setting is its GPU's.
    let (status, body) = set(&app, "hopper:1001", json!({"mode": "mps"})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("MIG instance 1 of GPU 0 of hopper takes one engine whole and is shared no further; set how its GPU is shared instead"))
    );

    // A restart finds the made-up GPU cut as committed, and what ran in an instance runs there still.
    let app = app.restart().await;
    assert_eq!(gpus(&app, "hopper").await, cut_up);
    app.fleet.check_ledger().await.unwrap();
    let (_, big) = app.get("/api/workers/big").await;
    assert_eq!(big["gpus"], json!([1000]), "{big}");

    once_idle(&app, "hopper:0", json!({"mode": "time-slicing"}), "big").await;
    assert_eq!(
        gpus(&app, "hopper").await,
        [(0, Value::Null, 80 << 30), (1, Value::Null, 80 << 30)]
    );
    // What waited for the whole GPU's room goes there now.
    let (_, body) = app.get("/api/workers/cut").await;
    assert_eq!(body["gpus"], json!([0]), "{body}");
    let (_, log) = app.get("/api/audit?action=gpu.sharing").await;
    assert_eq!(
        log[0]["before"],
        json!({"sharing": {"mode": "mig"}, "instances": ["3g.40gb", "2g.20gb", "1g.10gb"]}),
        "{log}"
    );
    assert_eq!(
        log[0]["after"],
        json!({"sharing": {"mode": "time-slicing"}, "instances": null})
    );
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_layout_the_menu_cannot_hold_or_a_machine_tessera_cannot_cut_is_refused_and_nothing_is_stored(
) {
    let app = TestApp::made_up(HOPPER).await;
    let cases = [
        (json!({"mode": "mig", "instances": ["4g.40gb", "4g.40gb"]}),
            "GPU 1 of hopper: An H100 80GB has 7 compute and 8 memory slices (and at most 7 instances); these take 8 and 8: 4g.40gb (4+4), 4g.40gb (4+4), each as compute+memory."),
        (json!({"mode": "mig", "instances": ["3g.71gb"]}),
            "GPU 1 of hopper: An H100 80GB has no MIG profile \"3g.71gb\"; its menu is 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb."),
        (json!({"mode": "mig"}),
            "GPU 1 of hopper: Name at least one instance, such as 3g.40gb."),
    ];
    for (body, error) in cases {
        let (status, answer) = set(&app, "hopper:1", body.clone()).await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some(error)),
            "{body}"
        );
    }
    let remote = TestApp::new(HOPPER).await;
    let (status, answer) = set(
        &remote,
        "hopper:0",
        json!({"mode": "mig", "instances": ["7g.80gb"]}),
    )
    .await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("GPU 0 of hopper is on hopper, where Tessera cannot cut a GPU: MIG is applied to this server's own GPUs (and the demo fleet's); on a node, cut it with nvidia-smi and start Ray there again with the line `tessera ray-node` prints"))
    );
    for app in [&app, &remote] {
        assert_eq!(
            gpus(app, "hopper").await,
            [(0, Value::Null, 80 << 30), (1, Value::Null, 80 << 30)]
        );
        let (_, log) = app.get("/api/audit?action=gpu.sharing").await;
        assert_eq!(log, json!([]));
    }
}

#[tokio::test]
async fn this_machine_s_gpu_is_cut_through_nvidia_smi_its_instances_read_back_as_gpus_and_a_cut_that_fails_half_way_is_undone_and_not_stored(
) {
    let app = TestApp::hopper_here(&[]).await;
    let dir = app.dir.path();
    let cut = json!({"mode": "mig", "instances": ["1g.10gb", "3g.40gb"]});

    stand_in_nvidia_smi(dir, "Enabled", Some("-cgi 19:4"));
    let (status, body) = set(&app, "hopper:1", cut.clone()).await;
    // The stand-in's folder, as the error names the program, is left out.
    let error = body["error"]
        .as_str()
        .map(|e| e.replace(&format!("{}/", dir.display()), ""));
    assert_eq!(
        (status, error.as_deref()),
        (StatusCode::CONFLICT, Some("GPU 1 of hopper could not be cut: nvidia-smi mig -i 1 -cgi 19:4 -C failed (exit status: 3): Failed to create GPU instances: Insufficient Resources; the instances made before it were removed and the GPU left whole")),
        "{body}"
    );
    assert_eq!(
        nvidia_smi_calls(dir),
        [
            "-i 1 -mig 1",
            "-i 1 --query-gpu=mig.mode.current --format=csv,noheader",
            "mig -i 1 -dci",
            "mig -i 1 -dgi",
            "mig -i 1 -cgi 9:0 -C",
            "mig -i 1 -cgi 19:4 -C FAILED",
            "mig -i 1 -dci",
            "mig -i 1 -dgi",
            "-i 1 -mig 0",
        ]
    );
    assert_eq!(
        gpus(&app, "hopper").await,
        [(0, Value::Null, 80 << 30), (1, Value::Null, 80 << 30)],
        "read back whole"
    );
    let (_, log) = app.get("/api/audit?action=gpu.sharing").await;
    assert_eq!(log, json!([]), "nothing is stored");

    // A board that turns MIG on only after a reset is left as it was, and told how.
    stand_in_nvidia_smi(dir, "Disabled", None);
    let (status, body) = set(&app, "hopper:1", cut.clone()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("GPU 1 of hopper could not be cut: MIG mode of GPU 1 is \"Disabled\", not Enabled: this board turns it on only after a GPU reset (nvidia-smi -r -i 1) or a reboot, which Tessera does not do; reset it, then cut it again"))
    );
    assert_eq!(
        nvidia_smi_calls(dir).last().map(String::as_str),
        Some("-i 1 -mig 0")
    );

    stand_in_nvidia_smi(dir, "Enabled", None);
    let (status, body) = set(&app, "hopper:1", cut).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let instance = |n: u64, profile: &str, mib: u64| {
        (
            2000 + n,
            json!({"role": "instance", "parent": 1, "profile": profile}),
            mib << 20,
        )
    };
    assert_eq!(
        gpus(&app, "hopper").await,
        [
            (0, Value::Null, 80 << 30),
            (1, json!({"role": "cut"}), 80 << 30),
            instance(0, "3g.40gb", 40448),
            instance(1, "1g.10gb", 9984),
        ]
    );
    let (status, body) = app.post_worker(&whole("big", "hopper:2000")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(cuda_devices(&app, "big").await, "MIG-1-0");

    stand_in_nvidia_smi(dir, "Enabled", None);
    once_idle(&app, "hopper:1", json!({"mode": "time-slicing"}), "big").await;
    assert_eq!(
        nvidia_smi_calls(dir),
        ["mig -i 1 -dci", "mig -i 1 -dgi", "-i 1 -mig 0"]
    );
    assert_eq!(
        gpus(&app, "hopper").await,
        [(0, Value::Null, 80 << 30), (1, Value::Null, 80 << 30)]
    );
    let (_, log) = app.get("/api/audit?action=gpu.sharing").await;
    assert_eq!(log.as_array().unwrap().len(), 2);
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test]
async fn a_gpu_cut_by_hand_takes_no_work_and_is_joined_back_when_it_is_set_to_be_shared() {
    let app = TestApp::hopper_here(&[0]).await;
    let dir = app.dir.path();
    let (_, body) = app.post_worker(&pinned("chat", 5.0, "hopper:0")).await;
    assert_eq!(
        body["pending_reasons"],
        json!(["GPU 0 of hopper is cut into MIG instances: work runs in those"])
    );
    stand_in_nvidia_smi(dir, "Enabled", None);
    let (status, body) = set(&app, "hopper:0", json!({"mode": "time-slicing"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        nvidia_smi_calls(dir),
        ["mig -i 0 -dci", "mig -i 0 -dgi", "-i 0 -mig 0"]
    );
    let (_, body) = app.get("/api/workers/chat").await;
    assert_eq!(
        body["gpus"],
        json!([0]),
        "what waited goes there now: {body}"
    );
}

#[tokio::test]
async fn a_gpu_stored_as_cut_is_cut_again_after_a_reboot_lost_its_instances_but_not_once_its_mig_mode_was_turned_off(
) {
    let app = TestApp::hopper_here(&[0]).await;
    sqlx::query("INSERT INTO gpu_sharing (machine, gpu_index, mode, mig_instances) VALUES ('hopper', 0, 'mig', '[\"3g.40gb\", \"3g.40gb\"]')")
        .execute(&app.pool)
        .await
        .unwrap();
    let app = app.restart().await;
    let dir = app.dir.path().to_owned();
    stand_in_nvidia_smi(&dir, "Enabled", None);
    app.fleet.clone().recut_after_restart().await;
    assert_eq!(
        &nvidia_smi_calls(&dir)[4..],
        ["mig -i 0 -cgi 9:0 -C", "mig -i 0 -cgi 9:4 -C"]
    );
    let indices: Vec<u64> = gpus(&app, "hopper")
        .await
        .into_iter()
        .map(|g| g.0)
        .collect();
    assert_eq!(indices, [0, 1, 1000, 1001]);
    let (_, log) = app.get("/api/audit?action=gpu.sharing").await;
    assert_eq!(log, json!([]), "what was stored did not change");

    // Listed already: nothing is cut again.
    let calls = nvidia_smi_calls(&dir).len();
    let app = app.restart().await;
    app.fleet.clone().recut_after_restart().await;
    assert_eq!(nvidia_smi_calls(&dir).len(), calls);

    // MIG mode turned off by hand (the stand-in's driver reads its calls): left so.
    std::fs::write(dir.join("calls"), "-i 0 -mig 0\n").unwrap();
    let app = app.restart().await;
    app.fleet.clone().recut_after_restart().await;
    assert_eq!(nvidia_smi_calls(&dir), ["-i 0 -mig 0"]);
}

#[tokio::test]
async fn while_nvidia_smi_cuts_a_gpu_other_writes_go_on_and_nothing_is_placed_on_that_gpu() {
    use std::os::unix::fs::PermissionsExt;
    let app = TestApp::hopper_here(&[]).await;
    let dir = app.dir.path();
    stand_in_nvidia_smi(dir, "Enabled", None);
    // The same stand-in, two seconds slower at creating an instance.
    let script = std::fs::read_to_string(dir.join("nvidia-smi")).unwrap();
    let slow = script.replacen(
        "#!/bin/sh\n",
        "#!/bin/sh\ncase \"$*\" in *-cgi*) sleep 2;; esac\n",
        1,
    );
    std::fs::write(dir.join("nvidia-smi"), slow).unwrap();
    std::fs::set_permissions(
        dir.join("nvidia-smi"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let cutting = set(
        &app,
        "hopper:1",
        json!({"mode": "mig", "instances": ["7g.80gb"]}),
    );
    let meanwhile = async {
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        let started = std::time::Instant::now();
        let (status, body) = app.post_worker(&pinned("elsewhere", 5.0, "hopper:0")).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "a write waited {:?} for the cut",
            started.elapsed()
        );
        let (_, body) = app.post_worker(&pinned("there", 5.0, "hopper:1")).await;
        assert_eq!(
            body["pending_reasons"],
            json!(["GPU 1 of hopper is cut into MIG instances: work runs in those"])
        );
        let (status, body) = set(&app, "hopper:1", json!({"mode": "time-slicing"})).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::CONFLICT, Some("GPU 1 of hopper is being cut into MIG instances or joined back; wait until that is done"))
        );
    };
    let ((status, body), ()) = tokio::join!(cutting, meanwhile);
    assert_eq!(status, StatusCode::OK, "{body}");
    let indices: Vec<u64> = gpus(&app, "hopper")
        .await
        .into_iter()
        .map(|g| g.0)
        .collect();
    assert_eq!(indices, [0, 1, 2000]);
    app.fleet.check_ledger().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_let_go_on_this_machine_but_still_stopping_keeps_its_gpu_from_being_cut_until_it_has_stopped(
) {
    let app = TestApp::hopper_here(&[]).await;
    stand_in_nvidia_smi(app.dir.path(), "Enabled", None);
    // An engine that ignores SIGTERM: it stops only when the stop timeout's SIGKILL comes.
    let stubborn = json!({
        "name": "stubborn",
        "command": "sh -c 'trap \"\" TERM; exec sleep 600'",
        "requested_resources": { "gpu_requests": { "count": 1, "shared": false, "ids": ["hopper:1"] } }
    });
    let (status, body) = app.post_worker(&stubborn.to_string()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let pid = || {
        app.fleet
            .runtime
            .engines()
            .into_iter()
            .find(|e| e.worker.as_deref() == Some("stubborn"))
            .and_then(|e| e.pid)
    };
    let started = std::time::Instant::now();
    while pid().is_none() {
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let pid = pid().unwrap();
    app.call(Method::DELETE, "/api/workers/stubborn", None)
        .await;

    let cut = json!({"mode": "mig", "instances": ["7g.80gb"]});
    let (status, body) = set(&app, "hopper:1", cut.clone()).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (StatusCode::CONFLICT, Some("GPU 1 of hopper runs stubborn, whose engine has not stopped yet: a GPU is cut into MIG instances, or joined back, only while nothing runs on it; remove or move it first"))
    );
    assert!(
        !nvidia_smi_calls(app.dir.path())
            .iter()
            .any(|c| c.contains("-mig 1")),
        "nothing was cut"
    );

    // Once it is gone (here by hand, rather than waiting out the stop timeout), the GPU is cut.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let started = std::time::Instant::now();
    loop {
        let (status, body) = set(&app, "hopper:1", cut.clone()).await;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{status}: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        gpus(&app, "hopper").await.last().map(|g| g.0),
        Some(2000),
        "cut"
    );
}

mod by_rows;
