//! Upgrades: a database as each earlier schema left it (migrated up to that migration only, with rows
//! written as the tables then stood) is opened by today's code, and every plan, worker, account and token
//! is still there. And the migrations themselves are never edited once released: their checksums are
//! committed in `migrations/SHA256SUMS`.

use crate::db;
use crate::testing::{TestApp, ATLAS, HOPPER, MAJIN};
use axum::http::{Method, StatusCode};
use placement::sharing::Sharing;
use placement::{Assignment, BasisPoints, Bytes, GpuRef};
use sha2::{Digest, Sha256};
use std::path::Path;

/// The password of every account of the fixtures.
const PASSWORD: &str = "an earlier password";

/// An API token of migration 6's time, for root-6; another, revoked; and migration 10's inference token.
const CI_6: &str = "tsr_0606060606060606060606060606060606060606060606060606060606060606";
const REVOKED_6: &str = "tsr_6060606060606060606060606060606060606060606060606060606060606060";
const CHAT_10: &str = "tsr_1010101010101010101010101010101010101010101010101010101010101010";

/// What each migration's time wrote, as its tables stood right after it: the rows are applied in order,
/// each right after its migration, so that the fixture for migration N holds the rows of 1 to N.
const ERAS: &[(i64, &str)] = &[
    (
        1,
        r#"
        INSERT INTO workers (name, request, command, env, state, assignment, pending_reasons, revision) VALUES
          ('listen-1', '{"cpu_cores":null,"memory_bytes":null,"gpu_requests":{"count":1.0,"shared":true,"memory_gb":2.5,"vendor":null,"models":[],"healthy_only":null,"ids":[],"policy":"Any"}}',
           'python3 -m listen', '{"LANG":"C.UTF-8"}', 'placed',
           '{"machine":"majin","gpus":[0],"shared":2684354560,"cpu_cores":0,"memory":0}', '[]', 2),
          ('notebook-1', '{"cpu_cores":null,"memory_bytes":null,"gpu_requests":{"count":1.0,"shared":true,"memory_gb":500.0,"vendor":null,"models":[],"healthy_only":null,"ids":[],"policy":"Any"}}',
           NULL, '{}', 'pending', NULL, '["no GPU offers 500 GB"]', 1);
        "#,
    ),
    (
        2,
        r#"
        INSERT INTO models (name, engine, default_share, group_name, model_path, system) VALUES
          ('semantic-router', 'vllm', 1000, 'chat', 'models/semantic-router', 1),
          ('glm-5.3', 'vllm', 4000, 'chat', 'zai-org/GLM-5.3', 0);
        INSERT INTO groups (name, gpus, revision) VALUES ('chat', '[{"machine":"atlas","index":0}]', 3);
        INSERT INTO group_members (group_name, model, share, position) VALUES
          ('chat', 'glm-5.3', 4000, 0), ('chat', 'semantic-router', 1000, 1);
        "#,
    ),
    (
        3,
        r#"
        INSERT INTO instance (id, token) VALUES (1, 'fixture-0003');
        INSERT INTO models (name, engine, default_share, group_name, model_path, system, command, args, env) VALUES
          ('embedder', 'command', 500, NULL, 'BAAI/bge-m3', 0,
           'text-embeddings-router --model-id {model} --port {port}', '["--max-batch-tokens","8192"]', '{"RUST_LOG":"info"}');
        INSERT INTO groups (name, gpus, revision) VALUES ('embed', '[{"machine":"atlas","index":1}]', 1);
        INSERT INTO group_members (group_name, model, share, position, args, env) VALUES
          ('embed', 'embedder', 2000, 0, '["--pooling","cls"]', '{"OMP_NUM_THREADS":"4"}');
        -- A process that is not there (and whose start time is not its): never adopted, never stopped.
        INSERT INTO engines (unit, fingerprint, pid, start_ticks, port) VALUES
          ('group:chat/glm-5.3@atlas', 'fixture', 4194303, 1, 41003);
        "#,
    ),
    (
        4,
        r#"
        INSERT INTO holdings (holder, name, group_name, machine, gpu_index, held_bytes, gpu_total_bytes, start_ms, end_ms) VALUES
          ('listen-1', 'listen-1', NULL, 'majin', 0, 2684354560, 8589934592, 1764547200000, 1764550800000);
        INSERT INTO gpu_samples (machine, gpu_index, at_ms, utilisation_percent, energy_mj) VALUES
          ('majin', 0, 1764547200000, 35, 1000), ('majin', 0, 1764547205000, 40, 1500);
        "#,
    ),
    (
        5,
        r#"
        INSERT INTO models (name, engine, default_share, group_name, model_path, system, command, args, env) VALUES
          ('vision', 'sglang', 2500, NULL, 'Qwen/Qwen2.5-VL-7B-Instruct', 0, NULL, '[]', '{}');
        INSERT INTO workers (name, request, env, state, assignment, model, args) VALUES
          ('vision', '{"cpu_cores":null,"memory_bytes":null,"gpu_requests":{"count":1.0,"shared":false,"memory_gb":null,"vendor":null,"models":[],"healthy_only":null,"ids":["hopper:0"],"policy":"Any"}}',
           '{}', 'placed', '{"machine":"hopper","gpus":[0],"shared":null,"cpu_cores":0,"memory":0}', 'vision', '["--tp","1"]');
        "#,
    ),
    (
        6,
        r#"
        INSERT INTO users (name, password_hash, role) VALUES
          ('root-6', '{password_hash}', 'admin'), ('ops-6', '{password_hash}', 'operator'), ('look-6', '{password_hash}', 'viewer');
        INSERT INTO api_tokens (user_id, name, hash, prefix) VALUES
          ((SELECT id FROM users WHERE name = 'root-6'), 'ci-6', 'bd8d67095cfb6f09f0da58d59894f48ccf6a57befa0872f6e62b5c513bd3b61f', 'tsr_060606');
        INSERT INTO api_tokens (user_id, name, hash, prefix, revoked_at) VALUES
          ((SELECT id FROM users WHERE name = 'look-6'), 'old-6', 'e82b1ea53f94e2e41d8bce2f664efc807d80c96fc14f61f64326838305e95f89', 'tsr_606060', '2026-12-03T10:00:00.000Z');
        INSERT INTO sessions (id, data, expiry_date) VALUES ('a-plain-session-id', '{}', 4102444800);
        INSERT INTO audit (actor, action, target, after) VALUES ('root-6', 'worker.create', 'listen-1', '{"name":"listen-1"}');
        "#,
    ),
    (
        7,
        r#"
        INSERT INTO gpu_sample_runs (machine, gpu_index, first_ms, first_utilisation_percent, first_energy_mj,
                                     last_ms, last_utilisation_percent, last_energy_mj, samples, busy_ms, energy_mj) VALUES
          ('majin', 0, 1764540000000, 20, 100, 1764540600000, 30, 900, 121, 150000, 800);
        "#,
    ),
    (
        8,
        r#"
        INSERT INTO engines (unit, fingerprint, pid, start_ticks, port, boot_id) VALUES
          ('group:embed/embedder@atlas', 'fixture', 4194302, 1, 41008, 'not-this-boot');
        "#,
    ),
    (
        9,
        r#"
        INSERT INTO models (name, engine, default_share, group_name, model_path, system, command, args, env, secret_env) VALUES
          ('speech', 'llamacpp', 1000, NULL, 'models/speech.gguf', 0, NULL, '[]', '{"LICENCE_KEY":"k-9"}', '["LICENCE_KEY"]');
        "#,
    ),
    (
        10,
        r#"
        INSERT INTO api_tokens (user_id, name, hash, prefix, scope, models, expires_at) VALUES
          ((SELECT id FROM users WHERE name = 'ops-6'), 'chat-10', '1d0807aeb0292668f9fa628ad8e7eb512999eb3334388c1bbdbf8e29a5959a43',
           'tsr_101010', 'inference', '["glm-5.3"]', '2999-01-01T00:00:00Z');
        INSERT INTO gateway_calls (hour_ms, model, key, requests, failed, prompt_tokens, completion_tokens) VALUES
          (1764547200000, 'glm-5.3', 'ops-6/chat-10 (tsr_101010)', 10, 1, 300, 900);
        "#,
    ),
    (
        11,
        r#"
        INSERT INTO models (name, engine, default_share, group_name, model_path, system, command, args, env, secret_env) VALUES
          ('reranker', 'vllm', 1500, NULL, 'BAAI/bge-reranker-v2-m3', 0, NULL, '[]', '{}', '[]');
        INSERT INTO group_members (group_name, model, share, position, args, env, on_demand, keep_alive_s, loaded) VALUES
          ('embed', 'reranker', 1500, 1, '[]', '{}', 1, 600, 0);
        UPDATE groups SET revision = revision + 1 WHERE name = 'embed';
        "#,
    ),
    (
        12,
        r#"
        INSERT INTO gpu_samples (machine, gpu_index, at_ms, utilisation_percent, energy_mj, used_bytes, held_outside_bytes, temperature_c, power_mw) VALUES
          ('majin', 0, 1764547210000, 45, 2000, 3758096384, 1073741824, 61, 95000);
        "#,
    ),
    (
        13,
        r#"
        INSERT INTO gpu_sharing (machine, gpu_index, mode, compute_percent) VALUES ('hopper', 1, 'mps', 50);
        "#,
    ),
    (
        14,
        r#"
        INSERT INTO gpu_sharing (machine, gpu_index, mode, compute_percent, mig_instances) VALUES ('atlas', 0, 'mps', NULL, NULL);
        "#,
    ),
    (
        15,
        r#"
        INSERT INTO cluster_machines (name, machine) VALUES ('vega', '{"name":"vega","node_id":"n1","address":"10.0.0.7","gpus":[{"index":0,"uuid":"GPU-v0","memory":85899345920,"resource":"tessera_gpu_vega_0","profile":null}],"demo":false,"alive":true,"model":"NVIDIA H100 80GB HBM3","cpu_cores":32,"memory":274877906944}');
        "#,
    ),
    (
        16,
        r#"
        INSERT INTO share_peaks (holder, model, machine, gpu_index, share_bytes, gpu_total_bytes, peak_bytes, first_ms, last_ms) VALUES
          ('group:embed/reranker@atlas', 'reranker', 'atlas', 0, 1610612736, 103079215104, 858993459, 1764547210000, 1764806410000);
        "#,
    ),
    (
        17,
        r#"
        INSERT INTO audit (actor, action, target, after, restarts, client) VALUES ('admin', 'plan.change', 'embed', '{}', '[]', '10.0.0.9');
        "#,
    ),
    (
        18,
        r#"
        -- A change made outside the server: its triggers note it, and the next start takes it up.
        UPDATE workers SET env = '{"FROM":"outside"}' WHERE name = 'notebook-1';
        "#,
    ),
    (
        19,
        r#"
        -- Where the database was opened last; a test server opens it from no file of its own.
        UPDATE instance SET home = 'fixture-machine /srv/tessera/tessera.db';
        "#,
    ),
    (
        20,
        r#"
        -- A member whose replicas follow its load, placed on the group's one machine.
        UPDATE group_members SET autoscale = '{"min":1,"max":1,"up_s":6,"down_s":60}', placed = '["atlas"]'
          WHERE model = 'embedder';
        "#,
    ),
    (
        21,
        r#"
        -- An on-demand member asleep, keeping what it was measured to keep.
        UPDATE group_members SET loaded = 1,
          asleep = '{"since_ms":1764547200000,"held":150,"held_bytes":1200000000}'
          WHERE model = 'reranker';
        "#,
    ),
];

/// Every machine the fixtures' workers and groups are on.
fn fleet() -> String {
    format!("{MAJIN}{ATLAS}{HOPPER}")
}

/// A data folder whose database was migrated up to `version` only, each era's rows written as it went.
async fn fixture(version: i64, password_hash: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let options = db::options(None, dir.path())
        .unwrap()
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    for (era, rows) in ERAS.iter().take_while(|(era, _)| *era <= version) {
        db::MIGRATOR.run_to(*era, &pool).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(
            rows.replace("{password_hash}", password_hash),
        ))
        .execute(&pool)
        .await
        .unwrap_or_else(|e| panic!("migration {era}'s rows: {e}"));
    }
    pool.close().await;
    dir
}

/// A group as the checks compare it: its name, its revision, and each member's share in basis points.
type Plan<'a> = (&'a str, i64, Vec<(&'a str, u32)>);

fn gpu(machine: &str, index: u32) -> GpuRef {
    GpuRef {
        machine: machine.to_owned(),
        index,
    }
}

#[test]
fn every_migration_has_the_rows_of_its_time() {
    let versions: Vec<i64> = db::MIGRATOR.iter().map(|m| m.version).collect();
    let eras: Vec<i64> = ERAS.iter().map(|(era, _)| *era).collect();
    assert_eq!(
        eras, versions,
        "a new migration adds its era to ERAS, rows written as its tables stand"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_every_earlier_schema_opens_with_every_plan_worker_account_and_token() {
    let password_hash = crate::accounts::hash_password(PASSWORD).unwrap();
    for (version, _) in ERAS {
        let version = *version;
        let app = TestApp::over(fixture(version, &password_hash).await, &fleet()).await;
        let at = format!("the database of migration {version}");
        let committed = app.fleet.committed();

        let workers: Vec<&str> = committed.workers.iter().map(|w| w.name.as_str()).collect();
        let mut expected = vec!["listen-1", "notebook-1"];
        if version >= 5 {
            expected.push("vision");
        }
        assert_eq!(workers, expected, "{at}: its workers");
        let listen = committed.worker("listen-1").unwrap();
        assert_eq!(
            listen.assignment,
            Some(Assignment {
                machine: "majin".to_owned(),
                gpus: vec![0],
                shared: Some(Bytes(2684354560)),
                cpu_cores: 0,
                memory: Bytes(0),
            }),
            "{at}"
        );
        assert_eq!(listen.command.as_deref(), Some("python3 -m listen"), "{at}");
        assert_eq!(listen.env["LANG"], "C.UTF-8", "{at}");
        assert_eq!(listen.revision, 2, "{at}");
        let notebook = committed.worker("notebook-1").unwrap();
        assert_eq!(notebook.assignment, None, "{at}");
        if version >= 3 {
            let token: String = sqlx::query_scalar("SELECT token FROM instance")
                .fetch_one(&app.pool)
                .await
                .unwrap();
            assert_eq!(
                token, "fixture-0003",
                "{at}: an upgrade keeps the installation's identity, and so its engines"
            );
        }
        if version >= 18 {
            assert_eq!(
                notebook.env["FROM"], "outside",
                "{at}: a change made outside"
            );
            let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM changes")
                .fetch_one(&app.pool)
                .await
                .unwrap();
            assert_eq!(
                left, 0,
                "{at}: the changes noted were taken up at the start"
            );
        }
        if version >= 5 {
            let vision = committed.worker("vision").unwrap();
            assert_eq!(vision.model.as_deref(), Some("vision"), "{at}");
            assert_eq!(vision.args, ["--tp", "1"], "{at}");
            assert_eq!(
                vision.assignment.as_ref().unwrap().machine,
                "hopper",
                "{at}"
            );
        }

        let plans: Vec<Plan> = committed
            .groups
            .iter()
            .map(|g| {
                let shares = g.members.iter().map(|s| (s.member.as_str(), s.share.0));
                (g.name.as_str(), g.revision, shares.collect())
            })
            .collect();
        let mut expected = Vec::new();
        if version >= 2 {
            expected.push((
                "chat",
                3,
                vec![("glm-5.3", 4000), ("semantic-router", 1000)],
            ));
        }
        if version >= 3 {
            let mut embed = vec![("embedder", 2000)];
            if version >= 11 {
                embed.push(("reranker", 1500));
            }
            expected.push(("embed", if version >= 11 { 2 } else { 1 }, embed));
        }
        expected.sort();
        assert_eq!(plans, expected, "{at}: its plans");
        if version >= 2 {
            assert_eq!(
                committed.group("chat").unwrap().gpus,
                [gpu("atlas", 0)],
                "{at}"
            );
            assert!(committed.model("semantic-router").unwrap().system, "{at}");
        }
        if version >= 3 {
            let embed = committed.group("embed").unwrap();
            assert_eq!(embed.serving["embedder"].args, ["--pooling", "cls"], "{at}");
            assert_eq!(
                embed.serving["embedder"].env["OMP_NUM_THREADS"], "4",
                "{at}"
            );
            let embedder = committed.model("embedder").unwrap();
            assert_eq!(embedder.args, ["--max-batch-tokens", "8192"], "{at}");
            assert!(embedder.command.is_some(), "{at}");
            assert_eq!(embed.demand.contains_key("reranker"), version >= 11, "{at}");
            assert_eq!(
                embed.autoscale.get("embedder").copied(),
                (version >= 20).then(|| placement::scale::Autoscale::new(1, 1).unwrap()),
                "{at}: an autoscaled member"
            );
            assert!(
                embed.runs_on("embedder", "atlas"),
                "{at}: placed where it was, or on every machine before replicas"
            );
            if version >= 20 {
                let first = embed.gpus.iter().find(|g| g.machine == "atlas").cloned();
                assert_eq!(
                    embed.placed["embedder"].iter().cloned().collect::<Vec<_>>(),
                    Vec::from_iter(first),
                    "{at}: a replica stored by machine is on the first of the group's GPUs there"
                );
            }
            assert_eq!(
                embed.asleep.get("reranker").and_then(|a| a.held),
                (version >= 21).then_some(BasisPoints(150)),
                "{at}: asleep, holding what it keeps"
            );
        }
        if version >= 9 {
            assert_eq!(
                committed.model("speech").unwrap().secret_env,
                ["LICENCE_KEY"],
                "{at}"
            );
        }
        let mps = committed.sharing(&gpu("hopper", 1));
        assert_eq!(mps.mode == Sharing::Mps, version >= 13, "{at}");
        if version >= 13 {
            assert_eq!(mps.compute_percent, Some(50), "{at}");
        }

        let accounts: Vec<(String, &str)> = crate::accounts::users(&app.pool)
            .await
            .unwrap()
            .into_iter()
            .map(|a| (a.name, a.role.as_str()))
            .filter(|(name, _)| name != crate::testing::ADMIN)
            .collect();
        let expected: Vec<(String, &str)> = if version >= 6 {
            [
                ("look-6", "viewer"),
                ("ops-6", "operator"),
                ("root-6", "admin"),
            ]
            .map(|(n, r)| (n.to_owned(), r))
            .to_vec()
        } else {
            Vec::new()
        };
        let mut accounts = accounts;
        accounts.sort();
        assert_eq!(accounts, expected, "{at}: its accounts");
        if version >= 6 {
            let signed_in = crate::accounts::authenticate(&app.pool, "ops-6", PASSWORD)
                .await
                .unwrap();
            assert!(signed_in.is_some(), "{at}: ops-6 signs in as before");
            let (status, _) = app
                .call_with(Some(CI_6), Method::GET, "/api/workers", None)
                .await;
            assert_eq!(status, StatusCode::OK, "{at}: the token ci-6 works");
            let (status, _) = app
                .call_with(Some(REVOKED_6), Method::GET, "/api/workers", None)
                .await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{at}: old-6 stays revoked"
            );
        }
        if version >= 10 {
            // An inference token: the gateway's alone, the API refuses it.
            let (status, _) = app
                .call_with(Some(CHAT_10), Method::GET, "/api/workers", None)
                .await;
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{at}: chat-10 keeps its scope"
            );
            let tokens = crate::accounts::tokens(&app.pool).await.unwrap();
            let chat = tokens.iter().find(|t| t.name == "chat-10").unwrap();
            assert_eq!(
                chat.limits.models.as_deref(),
                Some(&["glm-5.3".to_owned()][..]),
                "{at}"
            );
        }
        // Anything written since the upgrade commits as it would on a fresh database.
        let (status, body) = app
            .post_worker(&crate::testing::shared_worker("after-upgrade", 1.0))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{at}: {body}");
        assert_eq!(
            body["machine"], "majin",
            "{at}: placed beside listen-1 on majin's 7 GB"
        );
    }
}

/// `migrations/SHA256SUMS`: `sha256sum` lines, one per migration.
fn committed_checksums(dir: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(dir.join("SHA256SUMS"))
        .unwrap()
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (sum, file) = line.split_once("  ").expect("`SUM  FILE` lines");
            (file.to_owned(), sum.to_owned())
        })
        .collect()
}

#[test]
fn no_released_migration_is_ever_edited() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let committed = committed_checksums(&dir);
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".sql"))
        .collect();
    files.sort();
    for file in &files {
        let sum = crate::accounts::hex(&Sha256::digest(std::fs::read(dir.join(file)).unwrap()));
        match committed.iter().find(|(name, _)| name == file) {
            Some((_, expected)) => assert_eq!(
                &sum, expected,
                "migrations/{file} was edited after its release: a released migration is never changed \
                 (an installed database applied it as it was); put the change in a new migration"
            ),
            None => panic!(
                "migrations/{file} has no line in migrations/SHA256SUMS: add `{sum}  {file}` \
                 (sha256sum {file}) with the migration"
            ),
        }
    }
    for (file, _) in &committed {
        assert!(
            files.contains(file),
            "migrations/{file} is in SHA256SUMS but gone: a released migration is never removed"
        );
    }
}
