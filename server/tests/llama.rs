//! A real inference server behind the gateway: llama.cpp's own HTTP server (PyPI's `xllamacpp`) serving a
//! tiny random-weight llama model written by PyPI's `gguf` (`tests/llama/`), on CPU, as a `command` recipe
//! on this machine (`--here majin`). Both come with `./scripts/test`'s setup, in `.tools/venv`.

mod support;

use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::Server;

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/venv/bin/python");
const LLAMA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/llama");

/// Writes the tiny model into `dir`, and says where.
fn tiny_model(dir: &Path) -> String {
    tiny_model_of_context(dir, 256)
}

/// Writes the tiny model, trained for `context` tokens, into `dir`, and says where.
fn tiny_model_of_context(dir: &Path, context: u32) -> String {
    assert!(
        Path::new(PYTHON).exists(),
        "no {PYTHON}: run ./scripts/test, or `TESSERA_SETUP=test source scripts/setup`, to install xllamacpp and gguf"
    );
    let model = dir.join("tiny.gguf");
    let status = std::process::Command::new(PYTHON)
        .arg(format!("{LLAMA}/tiny_model.py"))
        .arg(&model)
        .arg(context.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "the tiny model is written");
    model.display().to_string()
}

async fn chat(server: &Server, stream: bool) -> (u16, Value) {
    server
        .send(
            "POST",
            "/v1/chat/completions",
            json!({"model": "tiny", "stream": stream, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_llama_cpp_server_answers_through_the_gateway_a_share_change_loses_no_request_and_its_tokens_are_counted(
) {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let server =
        Arc::new(Server::start_with(dir.path(), 100, &["--demo", "--here", "majin"]).await);
    let (status, added) = server
        .send(
            "POST",
            "/api/models",
            json!({
                "name": "tiny", "engine": "command", "default_share_percent": 50, "model_path": model,
                "command": format!("{PYTHON} {LLAMA}/serve.py --model {{model}} --host 127.0.0.1 --port {{port}}"),
            }),
        )
        .await;
    assert_eq!(status, 201, "{added}");
    let (status, deployed) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "tiny", "gpus": ["majin:0"], "share": 50}),
        )
        .await;
    assert_eq!(status, 201, "{deployed}");
    let engine = server.wait_healthy(1).await.remove(0);
    assert!(
        engine["command"][1].as_str().unwrap().ends_with("serve.py"),
        "the recipe itself runs: {engine}"
    );

    let (status, answer) = chat(&server, false).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert!(
        answer["usage"]["completion_tokens"].as_u64().unwrap() > 0,
        "{answer}"
    );
    assert!(
        answer["timings"].is_object(),
        "llama.cpp's own answer comes back unchanged: {answer}"
    );

    let (status, listed) = server.get("/v1/models").await;
    assert_eq!(
        (status, listed["data"][0]["id"].clone()),
        (200, json!("tiny"))
    );

    // Requests keep coming while the share changes and llama.cpp restarts: each is answered.
    let done = Arc::new(AtomicBool::new(false));
    let statuses = Arc::new(Mutex::new(Vec::new()));
    let client = {
        let (server, done, statuses) = (server.clone(), done.clone(), statuses.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let (status, answer) = chat(&server, false).await;
                statuses.lock().unwrap().push((status, answer));
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let group = engine["group"].as_str().unwrap().to_owned();
    let (status, change) = server
        .send(
            "PUT",
            &format!("/api/groups/{group}/plan"),
            json!({"revision": deployed["revision"], "shares": {"tiny": 40}}),
        )
        .await;
    assert_eq!(status, 200, "{change}");
    let first = engine["pid"].clone();
    support::wait_until("tiny runs again with its new share", || async {
        let now = server.engine_if_any("tiny").await;
        now.is_some_and(|e| e["state"] == "healthy" && e["pid"] != first)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    done.store(true, Ordering::Relaxed);
    client.await.unwrap();
    let statuses = std::mem::take(&mut *statuses.lock().unwrap());
    assert!(statuses.len() >= 3, "{} requests", statuses.len());
    for (status, answer) in statuses.iter() {
        assert_eq!(*status, 200, "a request was lost: {answer}");
    }

    // Every request is counted with the tokens llama.cpp reported in its usage.
    let tokens = |answer: &Value, field: &str| answer["usage"][field].as_u64().unwrap();
    let answers = || std::iter::once(&answer).chain(statuses.iter().map(|(_, a)| a));
    let (status, report) = server.get("/api/usage").await;
    assert_eq!(status, 200, "{report}");
    let counted = &report["requests"][0];
    assert_eq!(counted["model"], "tiny", "{report}");
    assert_eq!(counted["requests"], statuses.len() as u64 + 1, "{report}");
    assert_eq!(
        counted["prompt_tokens"],
        answers().map(|a| tokens(a, "prompt_tokens")).sum::<u64>()
    );
    assert_eq!(
        counted["completion_tokens"],
        answers()
            .map(|a| tokens(a, "completion_tokens"))
            .sum::<u64>()
    );
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_server_run_as_a_command_can_be_told_the_models_name_and_its_weights_path_never_reaches_a_client(
) {
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny_model(dir.path());
    let server = Server::start_with(dir.path(), 100, &["--demo", "--here", "majin"]).await;
    // "tiny" as a recipe that does not name it (llama.cpp answers under the weights' path), "named" as one
    // that does.
    let serve =
        format!("{PYTHON} {LLAMA}/serve.py --model {{model}} --host 127.0.0.1 --port {{port}}");
    let mut revision = None;
    for (name, command) in [
        ("tiny", serve.clone()),
        ("named", format!("{serve} --alias {{name}}")),
    ] {
        let (status, added) = server
            .send(
                "POST",
                "/api/models",
                json!({"name": name, "engine": "command", "default_share_percent": 40,
                       "model_path": weights, "command": command}),
            )
            .await;
        assert_eq!(status, 201, "{added}");
        let (status, deployed) = server
            .send(
                "POST",
                "/api/deployments",
                json!({"model": name, "gpus": ["majin:0"], "share": 40, "revision": revision}),
            )
            .await;
        assert_eq!(status, 201, "{deployed}");
        revision = Some(deployed["revision"].clone());
    }
    server.wait_healthy(2).await;
    let ask = |model: &str, stream: bool| json!({"model": model, "stream": stream, "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]});

    let named = server.engine("named").await;
    let command = named["command"].as_array().unwrap();
    assert_eq!(
        command[command.len() - 2..],
        [json!("--alias"), json!("named")]
    );
    let port = |engine: &Value| engine["port"].as_u64().unwrap() as u16;
    let (status, direct) = support::request(
        port(&named),
        "POST",
        "/v1/chat/completions",
        Some(ask("named", false)),
    )
    .await;
    assert_eq!(
        (status, &direct["model"]),
        (200, &json!("named")),
        "{direct}"
    );

    // Asked directly, llama.cpp says where its weights are; through the gateway, the model's name.
    let tiny = server.engine("tiny").await;
    let (status, direct) = support::request(
        port(&tiny),
        "POST",
        "/v1/chat/completions",
        Some(ask("tiny", false)),
    )
    .await;
    assert_eq!(
        (status, &direct["model"]),
        (200, &json!(weights)),
        "{direct}"
    );
    let (status, answer) = server
        .send("POST", "/v1/chat/completions", ask("tiny", false))
        .await;
    assert_eq!(
        (status, &answer["model"]),
        (200, &json!("tiny")),
        "{answer}"
    );
    assert!(
        answer["timings"].is_object(),
        "the rest comes back as it was: {answer}"
    );
    let (status, streamed) = support::request_bytes(
        server.port,
        Some(&server.token),
        "POST",
        "/v1/chat/completions",
        Some(ask("tiny", true)),
    )
    .await;
    let streamed = String::from_utf8(streamed.to_vec()).unwrap();
    assert_eq!(status, 200, "{streamed}");
    let chunks: Vec<Value> = streamed
        .split("data: ")
        .filter_map(|event| serde_json::from_str(event.trim()).ok())
        .collect();
    // Sampled from random weights, the answer may be bytes that make no whole character: llama.cpp then
    // sends no content chunk, and the last chunk alone is there to be renamed.
    assert!(!chunks.is_empty(), "{streamed}");
    for chunk in &chunks {
        assert_eq!(chunk["model"], "tiny", "{streamed}");
    }
    assert!(!streamed.contains(&weights), "{streamed}");
    server.stop().await;
}

/// A machine with an 8 GB GPU that is this one.
const SMALL: &str = r#"
[[machine]]
name = "small"
cpu_cores = 8
memory_gb = 32
[[machine.gpu]]
index = 0
model = "NVIDIA L4"
memory_gb = 8
"#;

/// What llama.cpp's log says it allocated, in bytes: its model, KV cache, compute and output buffers.
fn allocated(log: &[String]) -> u64 {
    let parts = [
        "model buffer size",
        "KV buffer size",
        "compute buffer size",
        "output buffer size",
    ];
    log.iter()
        .filter(|line| parts.iter().any(|p| line.contains(p)))
        .filter_map(|line| {
            let mib = line.split('=').nth(1)?.trim().strip_suffix("MiB")?.trim();
            mib.parse::<f64>().ok()
        })
        .map(|mib| (mib * f64::from(1u32 << 20)) as u64)
        .sum()
}

/// A server whose machine, `small`, is this one with one 8 GB L4, and whose `llama-server` is llama.cpp's
/// own server (xllamacpp here), found on the PATH as a llamacpp recipe runs it. Each start of it is
/// written down in `dir/llama-server.starts`.
async fn on_small_l4(dir: &Path) -> Server {
    on_this_machine(dir, SMALL).await
}

/// A server whose one machine, `small`, is this one as `inventory` describes it, with llama.cpp's own
/// server as `llama-server` as [`on_small_l4`] has it.
async fn on_this_machine(dir: &Path, inventory_toml: &str) -> Server {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let llama_server = bin.join("llama-server");
    let starts = dir.join("llama-server.starts");
    std::fs::write(
        &llama_server,
        format!(
            "#!/bin/sh\necho \"$@\" >> {}\nexec {PYTHON} {LLAMA}/serve.py \"$@\"\n",
            starts.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &llama_server,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let inventory = dir.join("small.toml");
    std::fs::write(&inventory, inventory_toml).unwrap();
    let sources = [
        "--inventory",
        inventory.to_str().unwrap(),
        "--here",
        "small",
    ];
    Server::start_with_env(dir, 100, &sources, &[("PATH", &path)]).await
}

/// A server [`on_small_l4`] with the tiny model, trained for 131,072 tokens (about 200 MB of context),
/// added with the recipe's `args`.
async fn tiny_on_small_l4(dir: &Path, args: Value) -> Server {
    let weights = tiny_model_of_context(dir, 131_072);
    let server = on_small_l4(dir).await;
    let (status, added) = server
        .send(
            "POST",
            "/api/models",
            json!({"name": "tiny", "engine": "llamacpp", "default_share_percent": 1,
                   "model_path": weights, "args": args}),
        )
        .await;
    assert_eq!(status, 201, "{added}");
    server
}

/// Deploying the tiny model on 0.6 % of the L4 (a 50 MB share): the status and the answer.
async fn deploy_on_50_mb(server: &Server) -> (u16, Value) {
    server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "tiny", "gpus": ["small:0"], "share": 0.6}),
        )
        .await
}

/// [`tiny_on_small_l4`], deployed on a 50 MB share.
async fn tiny_on_a_50_mb_share(dir: &Path, args: Value) -> Server {
    let server = tiny_on_small_l4(dir, args).await;
    let (status, deployed) = deploy_on_50_mb(&server).await;
    assert_eq!(status, 201, "{deployed}");
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llamacpp_context_given_over_its_share_by_a_recipe_or_a_deployment_is_refused_with_the_figures_before_anything_is_committed(
) {
    let dir = tempfile::tempdir().unwrap();
    // -c 0 asks for the model's own context, about 200 MB.
    let server = tiny_on_small_l4(dir.path(), json!(["-c", "0"])).await;
    let refusal = |answer: &Value| answer["error"].as_str().unwrap().to_owned();
    let (status, refused) = deploy_on_50_mb(&server).await;
    assert_eq!(status, 422, "{refused}");
    let message = refusal(&refused);
    assert!(
        message.starts_with(
            "tiny is not deployed: as its arguments set it, context 131072 × 1 slot takes "
        ) && message.ends_with(
            " over its 50 MB share on small: lower its -c or -np, or give it a larger share"
        ),
        "{message}"
    );
    let (_, groups) = server.get("/api/groups").await;
    assert_eq!(groups, json!([]), "nothing was committed");

    // A deployment's own arguments are judged as the recipe's are, at the deploy and at a change.
    let weights = tiny_model_of_context(dir.path(), 131_072);
    let (status, added) = server
        .send(
            "POST",
            "/api/models",
            json!({"name": "small-ctx", "engine": "llamacpp", "default_share_percent": 1,
                   "model_path": weights}),
        )
        .await;
    assert_eq!(status, 201, "{added}");
    let deploy = |args: Value| {
        server.send(
            "POST",
            "/api/deployments",
            json!({"model": "small-ctx", "gpus": ["small:0"], "share": 0.6, "args": args}),
        )
    };
    let (status, refused) = deploy(json!(["--ctx-size=0"])).await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refusal(&refused).contains("over its 50 MB share on small"),
        "{refused}"
    );
    let (status, deployed) = deploy(json!(["-c", "1024"])).await;
    assert_eq!(status, 201, "{deployed}");
    server.wait_healthy(1).await;
    let (_, group) = server.get("/api/groups/small-ctx").await;
    let (status, refused) = server
        .send(
            "PUT",
            "/api/deployments/small-ctx/serving",
            json!({"revision": group["revision"], "args": ["-c", "65536", "-np", "2"]}),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refusal(&refused).contains("context 65536 × 2 slots takes "),
        "{refused}"
    );
    let (_, after) = server.get("/api/groups/small-ctx").await;
    assert_eq!(
        after["revision"], group["revision"],
        "nothing was committed"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("llama-server.starts"))
            .unwrap()
            .lines()
            .count(),
        1,
        "the running engine was left as it was"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llamacpp_recipe_is_started_with_the_longest_context_its_share_holds_and_llama_cpp_allocates_no_more_than_the_share_as_its_own_report_says(
) {
    let dir = tempfile::tempdir().unwrap();
    // Its own context would take about 200 MB, four times its share.
    let server = tiny_on_a_50_mb_share(dir.path(), json!([])).await;
    let engine = server.wait_healthy(1).await.remove(0);
    let share = 8u64 * (1 << 30) * 60 / 10_000;

    let command: Vec<&str> = engine["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let at = command
        .iter()
        .position(|a| *a == "-c")
        .expect("-c is passed");
    let context: u32 = command[at + 1].parse().unwrap();
    assert!(
        context < 131_072 && context.is_multiple_of(256),
        "{context}"
    );
    assert_eq!(command[at + 2..at + 4], ["-np", "1"]);
    let sizing = engine["sizing"].as_str().unwrap();
    assert!(
        sizing.starts_with(&format!(
            "context {context} × 1 slot, the longest that fits its 50 MB share"
        )),
        "{sizing}"
    );

    // llama.cpp took the context it was given, and what it allocated for it fits the share.
    let id = engine["id"].as_str().unwrap();
    let (_, logs) = server
        .get(&format!("/api/engines/{id}/logs?lines=1000"))
        .await;
    let log: Vec<String> = serde_json::from_value(logs["lines"].clone()).unwrap();
    let taken = allocated(&log);
    assert!(taken > 0, "llama.cpp's buffer lines: {log:?}");
    assert!(
        taken <= share,
        "llama.cpp allocated {taken} bytes of a {share}-byte share"
    );
    assert!(
        taken * 100 >= share * 90,
        "the longest context that fits leaves little of the share unused: {taken} of {share}"
    );
    // The engine's own report, kept as its measurement where the GPU's reading ties it no memory.
    let reported = engine["reported_bytes"].as_u64().expect("a report");
    assert!(reported.abs_diff(taken) < 8, "{reported} against {taken}");
    let (status, answer) = chat(&server, false).await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await;
}

/// `small` with three 8 GB L4s.
fn three_l4s() -> String {
    let gpus: String = (1..3)
        .map(|i| format!("[[machine.gpu]]\nindex = {i}\nmodel = \"NVIDIA L4\"\nmemory_gb = 8\n"))
        .collect();
    format!("{SMALL}{gpus}")
}

/// The requests in flight to each of `model`'s engines now, as the gateway counts them (`/metrics`).
async fn in_flight(server: &Server, model: &str) -> Vec<u32> {
    let (status, text) = server.get_bytes("/metrics").await;
    assert_eq!(status, 200);
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| l.starts_with("tessera_engine_requests_in_flight{"))
        .filter(|l| l.contains(&format!("worker=\"{model}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect()
}

/// An answer: its status, and its content, or the whole answer where it has none.
type Answered = (u16, Result<String, Value>);

/// A chat completion's content, or the whole answer where it has none (cut, or an error).
fn content(answer: Value) -> Result<String, Value> {
    match answer["choices"][0]["message"]["content"].as_str() {
        Some(text) => Ok(text.to_owned()),
        None => Err(answer),
    }
}

/// `model`'s engines.
async fn engines_of(server: &Server, model: &str) -> Vec<Value> {
    let engines = server.engines().await;
    engines
        .into_iter()
        .filter(|e| e["model"] == model)
        .collect()
}

/// A client asking the tiny model one chat after another (the `n`th with `prompt(n)`), `pause` between,
/// until `stop`; each answer kept in `answered`.
fn keep_asking(
    server: &Arc<Server>,
    stop: &Arc<AtomicBool>,
    answered: &Arc<Mutex<Vec<Answered>>>,
    pause: Duration,
    prompt: impl Fn(u32) -> String + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let (server, stop, answered) = (server.clone(), stop.clone(), answered.clone());
    tokio::spawn(async move {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let (status, answer) = server
                .send(
                    "POST",
                    "/v1/chat/completions",
                    json!({"model": "tiny", "max_tokens": 8,
                           "messages": [{"role": "user", "content": prompt(n)}]}),
                )
                .await;
            answered.lock().unwrap().push((status, content(answer)));
            tokio::time::sleep(pause).await;
        }
    })
}

/// The model's replicas as `GET /api/models/{model}` shows them.
async fn replicas(server: &Server, model: &str) -> Value {
    let (status, answer) = server.get(&format!("/api/models/{model}")).await;
    assert_eq!(status, 200, "{answer}");
    answer["deployed"]["replicas"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_grows_a_one_replica_model_onto_other_gpus_and_its_queue_shrinks_a_replica_with_no_room_waits_saying_why_while_the_others_serve_and_after_the_burst_it_shrinks_back_with_no_request_failed_or_cut(
) {
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny_model(dir.path());
    let server = Arc::new(on_this_machine(dir.path(), &three_l4s()).await);
    // One slot (`-np 1`): a replica aims at one request in flight.
    let (status, added) = server
        .send(
            "POST",
            "/api/models",
            json!({"name": "tiny", "engine": "llamacpp", "default_share_percent": 1,
                   "model_path": weights, "args": ["-np", "1"]}),
        )
        .await;
    assert_eq!(status, 201, "{added}");
    let (status, deployed) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "tiny", "gpus": ["small:0", "small:1", "small:2"], "share": 1,
                   "replicas": {"min": 1, "max": 3, "up_s": 2, "down_s": 2}}),
        )
        .await;
    assert_eq!(status, 201, "{deployed}");
    server.wait_healthy(1).await;
    // Shared work (a hold alone: it runs nothing) takes GPU 2's room after the deploy: the third replica will find none there.
    let (status, filler) = server
        .send(
            "POST",
            "/api/workers",
            json!({"name": "filler", "requested_resources": {"gpu_requests": {
                "count": 1, "ids": ["small:2"], "shared": true, "memory_gb": 7.95}}}),
        )
        .await;
    assert_eq!(status, 201, "{filler}");
    assert_eq!(filler["state"], "placed", "{filler}");

    // Four clients, each asking one thing after another, every prompt its own.
    let stop = Arc::new(AtomicBool::new(false));
    let answered: Arc<Mutex<Vec<Answered>>> = Arc::default();
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let prompt = move |n| format!("{n} from client {client}: hello");
            keep_asking(&server, &stop, &answered, Duration::ZERO, prompt)
        })
        .collect();
    // On one replica, the four wait on its one slot.
    let mut alone = Vec::new();
    for _ in 0..10 {
        alone.extend(in_flight(&server, "tiny").await.into_iter().max());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    support::wait_until(
        "a second replica, and the third waiting for room",
        || async {
            let r = replicas(&server, "tiny").await;
            r["running"] == 2 && r["pending"] == 1
        },
    )
    .await;
    let grown = replicas(&server, "tiny").await;
    let why = grown["pending_reasons"][0].as_str().unwrap_or_default();
    assert!(
        why.starts_with("GPU 2 of small: ") && why.contains("a replica needs"),
        "{grown}"
    );
    assert_eq!(grown["desired"], 3, "it asked for three: {grown}");
    support::wait_until("two replicas serving", || async {
        let engines = engines_of(&server, "tiny").await;
        engines.len() == 2 && engines.iter().all(|e| e["state"] == "healthy")
    })
    .await;
    let engines = engines_of(&server, "tiny").await;
    let mut gpus: Vec<Value> = engines.iter().map(|e| e["gpus"].clone()).collect();
    gpus.sort_by_key(|g| g.to_string());
    assert_eq!(
        gpus,
        [json!([0]), json!([1])],
        "a replica on each GPU with room"
    );
    // Two replicas share the four: the busiest has fewer waiting on it than the one had.
    let mut shared = Vec::new();
    for _ in 0..10 {
        shared.extend(in_flight(&server, "tiny").await.into_iter().max());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mean = |v: &[u32]| f64::from(v.iter().sum::<u32>()) / v.len().max(1) as f64;
    assert!(
        mean(&shared) < mean(&alone),
        "the busiest replica's requests in flight: {alone:?} on one, {shared:?} on two"
    );

    // The burst ends; one client asks on, one thing at a time, while the model shrinks back to one.
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let done = Arc::new(AtomicBool::new(false));
    let prompt = |n| format!("{n}: after the burst");
    let trickle = keep_asking(&server, &done, &answered, Duration::from_millis(50), prompt);
    support::wait_until("back to one replica, its engine alone left", || async {
        replicas(&server, "tiny").await["running"] == 1
            && engines_of(&server, "tiny").await.len() == 1
    })
    .await;
    done.store(true, Ordering::Relaxed);
    trickle.await.unwrap();
    let last = replicas(&server, "tiny").await;
    assert_eq!(
        (&last["decisions"][0]["from"], &last["decisions"][0]["to"]),
        (&json!(2), &json!(1)),
        "{last}"
    );
    let answered = std::mem::take(&mut *answered.lock().unwrap());
    let failed: Vec<&Answered> = answered
        .iter()
        .filter(|(status, content)| *status != 200 || content.is_err())
        .collect();
    assert!(
        failed.is_empty(),
        "of {} requests: {failed:?}",
        answered.len()
    );
    Arc::into_inner(server).unwrap().stop().await;
}
