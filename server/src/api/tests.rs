//! The REST API on a real SQLite file: one test per rule and error.

use crate::testing::{majin_and_node, shared_worker, TestApp, MAJIN};
use axum::http::{Method, StatusCode};
use serde_json::{json, Value};

fn error(body: &Value) -> &str {
    body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("an error body, got {body}"))
}

#[tokio::test]
async fn the_seed_request_is_placed_with_its_shared_gb() {
    let app = TestApp::new(MAJIN).await;
    let (status, body) = app
        .post_worker(
            r#"{"name": "listen", "requested_resources": {"cpu_cores": 2, "memory_bytes": 4294967296,
                "gpu_requests": {"count": 1, "shared": true, "memory_gb": 2.5}}}"#,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["state"], "placed");
    assert_eq!(body["machine"], "majin");
    assert_eq!(body["gpus"], json!([0]));
    assert_eq!(body["gpu_shared_gb"], 2.5);
    assert_eq!(body["revision"], 1);
    let (status, again) = app.get("/api/workers/listen").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again, body);
}

#[tokio::test]
async fn a_worker_beside_six_and_a_half_gb_waits_with_the_seed_reason() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("listen", 2.2)).await;
    app.post_worker(&shared_worker("voice", 4.3)).await;
    let (status, body) = app.post_worker(&shared_worker("notebook", 1.5)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["state"], "pending");
    assert_eq!(
        body["pending_reasons"],
        json!(["GPU 0 of majin: 6.5 of 7 GB taken by shared work; it needs 1.5"])
    );
    assert_eq!(body["machine"], Value::Null);
}

#[tokio::test]
async fn a_worker_larger_than_what_the_gpu_offers_waits_with_the_seed_reason() {
    let app = TestApp::new(MAJIN).await;
    let (_, body) = app.post_worker(&shared_worker("big", 7.5)).await;
    assert_eq!(
        body["pending_reasons"],
        json!(["GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Tessera); it needs 7.5"])
    );
}

#[tokio::test]
async fn malformed_json_is_a_400_that_says_so() {
    let app = TestApp::new(MAJIN).await;
    let (status, body) = app.post_worker(r#"{"name": "x", "#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error(&body).starts_with("the request body is not valid JSON"),
        "{body}"
    );
}

#[tokio::test]
async fn requests_the_rules_refuse_are_422_with_what_to_fix() {
    let app = TestApp::new(MAJIN).await;
    let cases = [
        (
            json!({"memory_gb": 2}),
            "gpu_requests.memory_gb is only for shared GPUs",
        ),
        (
            json!({"shared": true}),
            "gpu_requests.memory_gb is required with shared",
        ),
        (
            json!({"shared": true, "memory_gb": 2, "policy": "All"}),
            "policy All cannot be shared",
        ),
        (json!({"count": 0}), "gpu_requests.count must be at least 1"),
        (json!({"count": -2}), "gpu_requests.count is negative"),
        (
            json!({"shared": true, "memory_gb": -1}),
            "gpu_requests.memory_gb is negative",
        ),
        (
            json!({"shared": true, "memory_gb": 1e300}),
            "gpu_requests.memory_gb is too large",
        ),
        (
            json!({"count": 1.5}),
            "gpu_requests.count is not a whole number",
        ),
        (json!({"colour": "red"}), "unknown field `colour`"),
    ];
    for (gpu_requests, expected) in cases {
        let body =
            json!({"name": "w", "requested_resources": {"gpu_requests": gpu_requests}}).to_string();
        let (status, answer) = app.post_worker(&body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{gpu_requests}: {answer}"
        );
        assert!(
            error(&answer).contains(expected),
            "{gpu_requests}: {answer}"
        );
    }
    let (_, workers) = app.get("/api/workers").await;
    assert_eq!(workers, json!([]), "nothing stored after a refusal");
}

#[tokio::test]
async fn a_bad_name_is_refused() {
    let app = TestApp::new(MAJIN).await;
    for name in ["", "../etc", "a b", &"x".repeat(64)] {
        let (status, body) = app.post_worker(&shared_worker(name, 1.0)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name:?}");
        assert!(
            error(&body).contains("use 1 to 63 letters, digits"),
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_name_that_exists_is_a_409() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("listen", 1.0)).await;
    let (status, body) = app.post_worker(&shared_worker("listen", 2.0)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        error(&body),
        "a worker named listen exists; choose another name, or delete it first"
    );
    let (_, kept) = app.get("/api/workers/listen").await;
    assert_eq!(kept["gpu_shared_gb"], 1.0, "the first one is untouched");
}

#[tokio::test]
async fn unknown_workers_and_machines_are_404() {
    let app = TestApp::new(MAJIN).await;
    let (status, body) = app.get("/api/workers/nobody").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error(&body), "there is no worker named nobody");
    assert_eq!(
        app.call(Method::DELETE, "/api/workers/nobody", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/api/machines/nowhere").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/api/machines/nowhere/workers").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn deleting_a_sharer_places_the_oldest_pending_worker_that_fits() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("a", 5.0)).await;
    app.post_worker(&shared_worker("first", 4.0)).await;
    app.post_worker(&shared_worker("second", 4.0)).await;
    let (status, _) = app.call(Method::DELETE, "/api/workers/a", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, first) = app.get("/api/workers/first").await;
    assert_eq!(first["state"], "placed");
    assert_eq!(first["revision"], 2);
    let (_, second) = app.get("/api/workers/second").await;
    assert_eq!(second["state"], "pending");
    assert_eq!(
        second["pending_reasons"],
        json!(["GPU 0 of majin: 4 of 7 GB taken by shared work; it needs 4"])
    );
}

#[tokio::test]
async fn the_gpu_is_whole_again_once_its_last_sharer_ends() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("a", 1.0)).await;
    app.post_worker(&shared_worker("b", 1.0)).await;
    app.call(Method::DELETE, "/api/workers/a", None).await;
    let (_, majin) = app.get("/api/machines/majin").await;
    assert_eq!(majin["gpus"][0]["mode"], "shared");
    app.call(Method::DELETE, "/api/workers/b", None).await;
    let (_, majin) = app.get("/api/machines/majin").await;
    assert_eq!(majin["gpus"][0]["mode"], "free");
    let whole = json!({"name": "trainer", "requested_resources": {"gpu_requests": {"count": 1}}})
        .to_string();
    let (_, trainer) = app.post_worker(&whole).await;
    assert_eq!(trainer["state"], "placed");
}

#[tokio::test]
async fn a_stale_revision_is_a_409_and_changes_nothing() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("a", 5.0)).await;
    app.post_worker(&shared_worker("b", 4.0)).await;
    app.call(Method::DELETE, "/api/workers/a?revision=1", None)
        .await;
    let (_, b) = app.get("/api/workers/b").await;
    assert_eq!(b["revision"], 2, "placed when a ended");
    let (status, body) = app
        .call(Method::DELETE, "/api/workers/b?revision=1", None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        error(&body),
        "worker b is at revision 2, not 1; read it again and retry"
    );
    assert_eq!(app.get("/api/workers/b").await.0, StatusCode::OK);
    let (status, _) = app
        .call(Method::DELETE, "/api/workers/b?revision=two", None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        app.call(Method::DELETE, "/api/workers/b?revision=2", None)
            .await
            .0,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn the_machine_page_data_says_who_shares_each_gpu() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("listen", 2.2)).await;
    app.post_worker(&shared_worker("voice", 4.2)).await;
    let (status, majin) = app.get("/api/machines/majin").await;
    assert_eq!(status, StatusCode::OK);
    let gpu = &majin["gpus"][0];
    assert_eq!(gpu["total_gb"], 8.0);
    assert_eq!(gpu["offered_gb"], 7.0);
    assert_eq!(gpu["held_outside_gb"], 1.0);
    assert_eq!(gpu["mode"], "shared");
    assert_eq!(
        gpu["summary"],
        "shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken"
    );
    let (_, workers) = app.get("/api/machines/majin/workers").await;
    let listen = workers
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "listen")
        .unwrap();
    assert_eq!(listen["gpus"], json!([0]));
    assert_eq!(listen["gpu_shared_gb"], 2.2);
    let (_, machines) = app.get("/api/machines").await;
    assert_eq!(machines.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn everything_survives_a_restart_of_the_server() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("listen", 2.2)).await;
    app.post_worker(&shared_worker("voice", 4.3)).await;
    app.post_worker(&shared_worker("notebook", 1.5)).await;
    let (_, before) = app.get("/api/workers").await;
    let app = app.restart().await;
    let (_, after) = app.get("/api/workers").await;
    assert_eq!(before, after);
    let (_, majin) = app.get("/api/machines/majin").await;
    assert_eq!(
        majin["gpus"][0]["taken_gb"], 6.5,
        "the scheduler holds what was placed"
    );
    app.call(Method::DELETE, "/api/workers/voice", None).await;
    let (_, notebook) = app.get("/api/workers/notebook").await;
    assert_eq!(notebook["state"], "placed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_shared_workers_never_overfill_a_gpu() {
    let app = std::sync::Arc::new(TestApp::new(&majin_and_node()).await);
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..200u32 {
        let app = app.clone();
        calls.spawn(async move {
            app.post_worker(&shared_worker(
                &format!("w{n}"),
                0.5 + f64::from(n % 7) * 0.5,
            ))
            .await
        });
    }
    while let Some(answer) = calls.join_next().await {
        let (status, body) = answer.expect("the call finished");
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (_, workers) = app.get("/api/workers").await;
    let workers = workers.as_array().unwrap();
    assert_eq!(workers.len(), 200);
    for w in workers {
        match w["state"].as_str().unwrap() {
            "placed" => assert!(w["gpu_shared_gb"].as_f64().unwrap() > 0.0),
            "pending" => assert!(!w["pending_reasons"].as_array().unwrap().is_empty(), "{w}"),
            other => panic!("state {other}"),
        }
    }
    let (_, machines) = app.get("/api/machines").await;
    for m in machines.as_array().unwrap() {
        for gpu in m["gpus"].as_array().unwrap() {
            let sharers: f64 = gpu["sharers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["gb"].as_f64().unwrap())
                .sum();
            assert!(
                sharers <= gpu["offered_gb"].as_f64().unwrap() + 1e-9,
                "{gpu}"
            );
        }
    }
    let placed = workers.iter().filter(|w| w["state"] == "placed").count();
    assert!(placed > 10, "the fleet fills up: {placed} placed");
}

#[tokio::test]
async fn a_plan_is_validated_against_the_gpus_it_runs_on() {
    let app = TestApp::new(MAJIN).await;
    let fits = json!({"members": [{"name": "router", "share": 10, "locked": true}, {"name": "glm", "share": 40}]}).to_string();
    let (status, verdict) = app
        .call(Method::POST, "/api/plans/validate", Some(&fits))
        .await;
    assert_eq!(status, StatusCode::OK, "{verdict}");
    assert_eq!(verdict["verdict"], "fits");
    assert_eq!(
        verdict["message"],
        "The shares add up to 50% of one accelerator, which fits."
    );

    let refused = json!({"members": [{"name": "a", "share": 60}, {"name": "b", "share": 0}, {"name": "c", "share": 45}]}).to_string();
    let (_, verdict) = app
        .call(Method::POST, "/api/plans/validate", Some(&refused))
        .await;
    assert_eq!(verdict["verdict"], "refused");
    assert_eq!(
        verdict["problems"],
        json!([
            {"message": "A model reserves no share of the accelerator.", "member": "b"},
            {"message": "The shares add up to more than the accelerator holds."}
        ])
    );

    let on_majin = json!({"members": [{"name": "a", "share": 50}, {"name": "b", "share": 40}], "gpus": ["majin:0"]}).to_string();
    let (_, verdict) = app
        .call(Method::POST, "/api/plans/validate", Some(&on_majin))
        .await;
    assert_eq!(
        verdict["problems"][0]["message"],
        "GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Tessera); it needs 7.2"
    );

    let warns = json!({"members": [{"name": "a", "share": 95}]}).to_string();
    let (_, verdict) = app
        .call(Method::POST, "/api/plans/validate", Some(&warns))
        .await;
    assert_eq!(verdict["verdict"], "fits");
    assert!(verdict["warning"]
        .as_str()
        .unwrap()
        .starts_with("More than 90%"));

    let bad = json!({"members": [{"name": "a", "share": -5}], "gpus": ["majin"]}).to_string();
    let (status, body) = app
        .call(Method::POST, "/api/plans/validate", Some(&bad))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        error(&body),
        "the share of a is negative; give a percentage such as 33.33"
    );
}

#[tokio::test]
async fn a_fresh_reading_of_a_machine_moves_what_it_offers_and_who_fits() {
    let app = TestApp::new(MAJIN).await;
    app.post_worker(&shared_worker("a", 3.0)).await;
    app.post_worker(&shared_worker("b", 3.0)).await;
    let inventory = crate::inventory::file::parse_inventory(MAJIN).unwrap();
    let mut majin = inventory[0].clone();
    majin.gpus[0].held_outside = placement::Bytes::gb(3);
    app.fleet.refresh_machine(majin.clone()).await.unwrap();
    let (_, machine) = app.get("/api/machines/majin").await;
    assert_eq!(machine["gpus"][0]["offered_gb"], 5.0);
    // Over what it offers: b stops once that has lasted --evict-after-s.
    let (_, b) = app.get("/api/workers/b").await;
    assert_eq!(b["state"], "placed", "{b}");
    let majin0 = placement::GpuRef::new("majin", 0);
    assert!(
        app.fleet
            .overcommitted_for(&majin0, std::time::Duration::from_secs(30))
            .await
    );
    app.fleet.refresh_machine(majin.clone()).await.unwrap();
    let (_, b) = app.get("/api/workers/b").await;
    assert_eq!(b["state"], "pending", "b no longer fits beside a: {b}");
    assert_eq!(
        b["pending_reasons"],
        json!(["GPU 0 of majin: 3 of 5 GB taken by shared work; it needs 3"])
    );
    majin.gpus[0].held_outside = placement::Bytes::gb(1);
    app.fleet.refresh_machine(majin).await.unwrap();
    let (_, b) = app.get("/api/workers/b").await;
    assert_eq!(
        b["state"], "placed",
        "placed again once the desktop lets go"
    );
}

#[tokio::test]
async fn an_engine_on_a_machine_without_an_agent_is_listed_as_stopped_with_the_reason() {
    let app = TestApp::new(MAJIN).await;
    let (status, _) = app.post_worker(&shared_worker("listen", 2.2)).await;
    assert_eq!(status, StatusCode::CREATED);
    app.fleet.runtime().settled().await;
    let (status, engines) = app.get("/api/engines").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(engines[0]["worker"], "listen");
    assert_eq!(engines[0]["state"], "stopped");
    assert_eq!(engines[0]["host"]["kind"], "remote");
    assert_eq!(
        engines[0]["message"],
        "majin is not this machine, and Tessera has no agent there to start engines with"
    );
    let (status, body) = app
        .call(Method::POST, "/api/engines/listen/restart", None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        error(&body),
        "listen runs on majin, where Tessera has no agent: it cannot be restarted from here"
    );
    let (status, body) = app.get("/api/engines/nothing/logs").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        error(&body),
        "there is no engine nothing; GET /api/engines lists them"
    );
    let (status, body) = app.get("/api/engines/listen/logs?lines=many").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        error(&body),
        "lines must be a whole number, such as ?lines=50"
    );

    let (status, _) = app.call(Method::DELETE, "/api/workers/listen", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    app.fleet.runtime().settled().await;
    assert_eq!(app.get("/api/engines").await.1, json!([]));
}

#[tokio::test]
async fn a_command_model_needs_a_command_template_and_env_names_are_checked() {
    let app = TestApp::new(MAJIN).await;
    let (status, body) = app
        .call(
            Method::POST,
            "/api/models",
            Some(r#"{"name": "tei", "engine": "command", "default_share_percent": 5, "group": null, "model_path": "BAAI/bge-m3"}"#),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        error(&body),
        "tei runs on the command engine, so it needs a \"command\" template, such as \"my-server --port {port} --model {model}\" (without unclosed quotes)"
    );
    let (status, body) = app
        .call(
            Method::POST,
            "/api/models",
            Some(r#"{"name": "tei", "engine": "command", "default_share_percent": 5, "group": null, "model_path": "BAAI/bge-m3",
                     "command": "text-embeddings-router --port {port}", "env": {"1BAD": "x"}}"#),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        error(&body),
        "environment variable name \"1BAD\": use letters, digits and '_', not starting with a digit"
    );
    let (status, body) = app
        .call(
            Method::POST,
            "/api/models",
            Some(r#"{"name": "tei", "engine": "command", "default_share_percent": 5, "group": null, "model_path": "BAAI/bge-m3",
                     "command": "text-embeddings-router --port {port}", "args": ["--max-batch-tokens", "16384"], "env": {"HF_HOME": "/models"}}"#),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, models) = app.get("/api/models").await;
    assert_eq!(models[0]["command"], "text-embeddings-router --port {port}");
    assert_eq!(models[0]["args"], json!(["--max-batch-tokens", "16384"]));
    assert_eq!(models[0]["env"], json!({"HF_HOME": "/models"}));
}

#[test]
fn the_openapi_document_lists_exactly_the_routes_the_router_serves() {
    let doc: Value =
        serde_json::from_str(crate::api::OPENAPI).expect("server/openapi.json is JSON");
    let mut documented: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |method| (path.clone(), method.to_uppercase()))
        })
        .collect();
    let mut served: Vec<(String, String)> = crate::api::table()
        .iter()
        .map(|r| (r.path.to_owned(), r.method.to_string()))
        .collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served);
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            assert!(
                op["summary"].is_string(),
                "{method} {path} says what it does"
            );
            for reference in op.to_string().split("#/components/schemas/").skip(1) {
                let name = reference.split('"').next().unwrap();
                assert!(
                    doc["components"]["schemas"].get(name).is_some(),
                    "{method} {path} names the schema {name}, which the document lacks"
                );
            }
        }
    }
}

#[tokio::test]
async fn the_openapi_document_is_served_to_anyone() {
    let app = TestApp::new(MAJIN).await;
    let (status, doc) = app
        .call_with(None, Method::GET, "/api/openapi.json", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["info"]["title"], "Tessera");
}

/// A list's page through the router: its body, and its `Link` next and `X-Total-Count`.
async fn list_page(
    app: &TestApp,
    uri: &str,
) -> (StatusCode, Value, Option<String>, Option<String>) {
    let request = axum::http::Request::builder()
        .uri(uri)
        .header(
            axum::http::header::AUTHORIZATION,
            format!("Bearer {}", app.token),
        )
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.send(request).await;
    let status = response.status();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (link, total) = (header("link"), header("x-total-count"));
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
        link,
        total,
    )
}

#[tokio::test]
async fn every_list_is_read_in_pages_by_following_next_and_narrowed_by_its_filters() {
    let app = TestApp::new(&majin_and_node()).await;
    // 23 workers: 20 of 0.1 GB placed, 3 too large to place, so pending.
    for i in 0..20 {
        let (status, _) = app
            .post_worker(&shared_worker(&format!("w{i:02}"), 0.1))
            .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    for i in 0..3 {
        let (status, _) = app
            .post_worker(&shared_worker(&format!("big{i}"), 5000.0))
            .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let mut seen = Vec::new();
    let mut next = Some("/api/workers?state=placed&limit=7".to_owned());
    let mut pages = 0;
    while let Some(uri) = next {
        let (status, body, link, total) = list_page(&app, &uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        assert_eq!(total.as_deref(), Some("20"), "every placed worker counts");
        seen.extend(
            body.as_array()
                .unwrap()
                .iter()
                .map(|w| w["name"].as_str().unwrap().to_owned()),
        );
        next = link.map(|l| {
            assert!(l.contains("state=placed"), "the filter is kept: {l}");
            l.trim_start_matches('<')
                .split('>')
                .next()
                .unwrap()
                .to_owned()
        });
        pages += 1;
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..20).map(|i| format!("w{i:02}")).collect();
    assert_eq!(seen, expected, "each once, oldest first");

    let (_, pending, link, _) = list_page(&app, "/api/workers?state=pending").await;
    assert_eq!(pending.as_array().unwrap().len(), 3);
    assert_eq!(link, None);
    let (_, on_node, _, _) = list_page(&app, "/api/machines?q=nod&state=reachable").await;
    assert_eq!(on_node.as_array().unwrap().len(), 1);

    for (uri, says) in [
        ("/api/workers?colour=red", "unknown field `colour`"),
        (
            "/api/engines?limit=0",
            "limit must be a whole number from 1 to 1000",
        ),
        ("/api/groups?cursor=x", "cursor is not one this API gave"),
        (
            "/api/machines?state=down",
            "state is reachable or unreachable",
        ),
    ] {
        let (status, body, _, _) = list_page(&app, uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        assert!(error(&body).contains(says), "{uri}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_asked_while_a_removed_model_s_engine_is_still_stopping_is_refused_and_starts_nothing(
) {
    let app = TestApp::with_local(&majin_and_node(), Some("node")).await;
    // Its engine takes two seconds to exit once told to stop.
    let command = crate::testing::answering(app.dir.path(), 2.0);
    let model = json!({"name": "slow-exit", "engine": "command", "default_share_percent": 10,
                       "group": null, "model_path": "slow-exit", "command": command});
    let (status, body) = app
        .call(Method::POST, "/api/models", Some(&model.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let deploy = json!({"model": "slow-exit", "gpus": ["node:0"], "share": 10});
    let (status, body) = app
        .call(Method::POST, "/api/deployments", Some(&deploy.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.fleet.runtime().settled().await;
    let (_, engines) = app.get("/api/engines").await;
    assert_eq!(engines[0]["state"], "healthy", "{engines}");
    let id = engines[0]["id"].as_str().unwrap().to_owned();

    let (_, groups) = app.get("/api/groups").await;
    let revision = &groups[0]["revision"];
    let (status, body) = app
        .call(
            Method::DELETE,
            &format!("/api/deployments/slow-exit?revision={revision}"),
            None,
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    let (status, body) = app
        .call(Method::POST, &format!("/api/engines/{id}/restart"), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(
        error(&body),
        format!("{} is being stopped: what ran it was removed, unloaded or moved, so it is not started again; GET /api/engines shows what runs", engines[0]["unit"].as_str().unwrap())
    );
    app.fleet.runtime().settled().await;
    assert_eq!(app.get("/api/engines").await.1, json!([]));
    app.fleet.check_ledger().await.unwrap();
}
