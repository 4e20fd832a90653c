use super::*;

fn spec(engine: Engine, share_gb: Option<u64>, gpus: &[u32]) -> EngineSpec {
    EngineSpec {
        unit: "group:text-router/glm@atlas".into(),
        machine: "atlas".into(),
        host: Host::Local,
        gpus: gpus.to_vec(),
        gpu_total: Bytes::gb(80),
        share: share_gb.map(Bytes::gb),
        gpu_offered: Bytes::gb(80),
        recipe: Recipe {
            engine,
            model_path: "zai-org/GLM".into(),
            command: None,
            args: vec!["--max-model-len".into(), "8192".into()],
            env: BTreeMap::from([("HF_HOME".into(), "/models".into())]),
        },
        mps: None,
        mig: BTreeMap::new(),
        asleep: false,
    }
}

#[test]
fn an_engine_given_a_key_takes_it_last_so_no_recipe_flag_overrides_it_and_in_its_environment() {
    for (engine, flag) in [
        (Engine::Vllm, true),
        (Engine::Sglang, true),
        (Engine::LlamaCpp, true),
        (Engine::Command, false),
    ] {
        let mut s = spec(engine, Some(32), &[0]);
        s.recipe.command = Some("serve --port {port} --key {api_key}".into());
        s.recipe.args.extend(["--api-key".into(), "mine".into()]);
        let launch = s
            .launch(
                8001,
                Bytes::gb(80),
                Path::new("/bin/tessera"),
                Some("k3y"),
                &Sizing::default(),
            )
            .unwrap();
        assert_eq!(launch.api_key.as_deref(), Some("k3y"));
        assert_eq!(launch.env[ENGINE_KEY_VAR], "k3y");
        let tail: Vec<&str> = launch
            .args
            .iter()
            .rev()
            .take(2)
            .map(String::as_str)
            .collect();
        if flag {
            assert_eq!(tail, ["k3y", "--api-key"], "{engine:?}");
        } else {
            assert!(launch.args.windows(2).any(|w| w == ["--key", "k3y"]));
        }
    }
    // Without a key, none is given.
    let launch = spec(Engine::Vllm, Some(32), &[0])
        .command_line(8001, Bytes::gb(40))
        .unwrap();
    assert!(!launch.args.contains(&"--api-key".to_owned()));
    assert!(!launch.env.contains_key(ENGINE_KEY_VAR));
}

#[test]
fn vllm_gets_its_share_as_a_fraction_of_the_whole_gpu() {
    let launch = spec(Engine::Vllm, Some(32), &[0])
        .command_line(8001, Bytes::gb(40))
        .unwrap();
    assert_eq!(launch.program, "vllm");
    assert_eq!(
        launch.args.join(" "),
        "serve zai-org/GLM --host 127.0.0.1 --port 8001 --served-model-name glm --gpu-memory-utilization 0.4 --max-model-len 8192"
    );
    assert_eq!(launch.env["TESSERA_GPU_MEMORY_GB"], "32");
    assert_eq!(launch.env["CUDA_VISIBLE_DEVICES"], "0");
    assert_eq!(launch.env["TESSERA_PORT"], "8001");
    assert_eq!(launch.env["HF_HOME"], "/models");
}

#[test]
fn sglang_gets_its_share_as_a_fraction_of_the_memory_free_when_it_starts() {
    // 32 GB of an 80 GB GPU, of which 64 GB are free as it starts: half of the free memory.
    let launch = spec(Engine::Sglang, Some(32), &[0, 1])
        .command_line(8002, Bytes::gb(64))
        .unwrap();
    assert_eq!(launch.program, "python3");
    assert_eq!(
        launch.args.join(" "),
        "-m sglang.launch_server --model-path zai-org/GLM --host 127.0.0.1 --port 8002 --served-model-name glm --mem-fraction-static 0.5 --tp-size 2 --max-model-len 8192"
    );
    assert_eq!(launch.env["CUDA_VISIBLE_DEVICES"], "0,1");
}

#[test]
fn fractions_round_down_and_never_pass_one() {
    assert_eq!(fraction(Bytes::gb(1), Bytes::gb(3)), "0.3333");
    assert_eq!(fraction(Bytes::gb(2), Bytes::gb(8)), "0.25");
    assert_eq!(fraction(Bytes::gb(9), Bytes::gb(8)), "1");
    let gpu = Bytes::gb(96);
    assert_eq!(
        fraction(gpu.share(placement::BasisPoints::percent(30)), gpu),
        "0.3"
    );
    assert_eq!(fraction(Bytes::gb(96) - Bytes(1), gpu), "0.9999");
}

#[test]
fn llama_cpp_is_told_its_share_by_the_environment() {
    let launch = spec(Engine::LlamaCpp, Some(8), &[0])
        .command_line(8003, Bytes::gb(80))
        .unwrap();
    assert_eq!(
        launch.args.join(" "),
        "-m zai-org/GLM --host 127.0.0.1 --port 8003 --alias glm --max-model-len 8192"
    );
    assert_eq!(launch.env["TESSERA_GPU_MEMORY_GB"], "8");
}

#[test]
fn llama_cpp_on_a_share_never_fits_itself_to_what_its_neighbours_leave_free() {
    let on = |share| {
        spec(Engine::LlamaCpp, share, &[0])
            .command_line(8003, Bytes::gb(80))
            .unwrap()
            .env
    };
    assert_eq!(on(Some(8))["LLAMA_ARG_FIT"], "off");
    assert_eq!(
        on(None).get("LLAMA_ARG_FIT"),
        None,
        "a whole GPU is its own"
    );
}

#[test]
fn a_command_template_is_split_into_words_and_filled_in() {
    let mut s = spec(Engine::Command, Some(20), &[0]);
    s.recipe.command = Some("serve-model --port {port} --name 'my model' --mem {gpu_memory_gb}GB --util {gpu_memory_fraction}".into());
    s.recipe.env.insert("TESSERA_PORT".into(), "1".into());
    let launch = s.command_line(9000, Bytes::gb(80)).unwrap();
    assert_eq!(launch.program, "serve-model");
    assert_eq!(
        launch.args,
        [
            "--port",
            "9000",
            "--name",
            "my model",
            "--mem",
            "20GB",
            "--util",
            "0.25",
            "--max-model-len",
            "8192"
        ]
    );
    // Tessera's own variables win over the recipe's.
    assert_eq!(launch.env["TESSERA_PORT"], "9000");
}

#[test]
fn a_command_template_is_given_the_name_the_gateway_serves_the_model_under() {
    let mut s = spec(Engine::Command, Some(20), &[0]);
    s.recipe.command = Some("llama-server -m {model} --port {port} --alias {name}".into());
    let launch = s.command_line(9000, Bytes::gb(80)).unwrap();
    assert_eq!(
        launch.args[..6],
        ["-m", "zai-org/GLM", "--port", "9000", "--alias", "glm"]
    );
    let template = s.recipe.command.as_deref();
    assert_eq!(
        owned_flag(Engine::Command, template, "--alias=other"),
        Some(("--alias".to_owned(), Owner::Name))
    );
}

#[test]
fn a_command_engine_without_a_usable_command_says_what_to_fix() {
    let s = spec(Engine::Command, Some(20), &[0]);
    assert_eq!(
        s.command_line(1, Bytes::ZERO).unwrap_err().to_string(),
        "group:text-router/glm@atlas has no command to run: give the worker a \"command\", or the model a command template"
    );
    let mut s = s;
    s.recipe.command = Some("serve 'open".into());
    assert!(matches!(
        s.command_line(1, Bytes::ZERO),
        Err(SpecError::BadTemplate { .. })
    ));
}

#[test]
fn a_whole_gpu_engine_is_told_the_whole_memory() {
    let launch = spec(Engine::Vllm, None, &[0])
        .command_line(1, Bytes::gb(80))
        .unwrap();
    assert!(!launch.args.contains(&"--gpu-memory-utilization".to_owned()));
    assert_eq!(launch.env["TESSERA_GPU_MEMORY_GB"], "80");
}

#[test]
fn a_simulated_engine_runs_the_demo_engine_with_the_real_command_line() {
    let mut s = spec(Engine::Vllm, Some(32), &[0]);
    s.host = Host::Simulated;
    let launch = s
        .launch(
            8001,
            Bytes::gb(80),
            Path::new("/bin/tessera"),
            None,
            &Sizing::default(),
        )
        .unwrap();
    assert_eq!(launch.program, "/bin/tessera");
    assert_eq!(&launch.args[..4], ["demo-engine", "--", "vllm", "serve"]);
    assert_eq!(launch.env["TESSERA_GPU_MEMORY_GB"], "32");
    // Without a command of its own, a simulated worker still runs: the demo engine stands in for nothing.
    s.recipe.engine = Engine::Command;
    let launch = s
        .launch(
            1,
            Bytes::ZERO,
            Path::new("/bin/tessera"),
            None,
            &Sizing::default(),
        )
        .unwrap();
    assert_eq!(launch.args, ["demo-engine", "--"]);
}

#[test]
fn the_fingerprint_moves_with_the_share_and_not_otherwise() {
    let a = spec(Engine::Vllm, Some(32), &[0]);
    let mut b = a.clone();
    assert_eq!(a.fingerprint(), b.fingerprint());
    b.share = Some(Bytes::gb(24));
    assert_ne!(a.fingerprint(), b.fingerprint());
}

#[test]
fn an_engine_made_an_mps_client_restarts_and_its_record_says_whose_client_it_is() {
    let plain = spec(Engine::Vllm, Some(32), &[0]);
    assert!(!plain.fingerprint().contains("mps"));
    assert_eq!(EngineSpec::mps_of(&plain.fingerprint()), None);
    let client = MpsClient {
        index: 0,
        uuid: "GPU-1".into(),
        compute_percent: Some(50),
    };
    let mps = EngineSpec {
        mps: Some(client.clone()),
        ..plain.clone()
    };
    assert_ne!(plain.fingerprint(), mps.fingerprint());
    assert_eq!(
        EngineSpec::mps_of(&mps.fingerprint()),
        Some(("atlas".to_owned(), client.clone()))
    );
    let on = |host| EngineSpec {
        host,
        ..mps.clone()
    };
    let node = |demo| Host::Cluster {
        address: "10.0.0.7".into(),
        uuids: BTreeMap::from([(0, "GPU-1".into())]),
        demo,
    };
    assert_eq!(
        EngineSpec::mps_of(&on(node(false)).fingerprint()),
        Some(("atlas".to_owned(), client)),
        "a node's engine rejoins its daemon there"
    );
    for nowhere in [node(true), Host::Simulated, Host::Remote] {
        assert_eq!(EngineSpec::mps_of(&on(nowhere).fingerprint()), None);
    }
}

#[test]
fn a_two_letter_abbreviation_of_a_flag_tessera_owns_is_known_as_that_flag() {
    let owned = |engine, arg| owned_flag(engine, None, arg);
    assert_eq!(
        owned(Engine::Vllm, "--ho=0.0.0.0"),
        Some(("--host".to_owned(), Owner::Host))
    );
    assert_eq!(
        owned(Engine::Sglang, "--po=1"),
        Some(("--port".to_owned(), Owner::Port))
    );
    assert_eq!(owned(Engine::Vllm, "--"), None);
    assert_eq!(owned(Engine::Vllm, "--max-model-len=4096"), None);
}

#[test]
fn an_argument_that_overrides_a_flag_tessera_sets_is_known_with_its_owner() {
    let owned = |engine, arg| owned_flag(engine, None, arg);
    assert_eq!(
        owned(Engine::Vllm, "--gpu-memory-utilization"),
        Some(("--gpu-memory-utilization".to_owned(), Owner::Share))
    );
    assert_eq!(
        owned(Engine::Vllm, "--gpu_memory_utilization=0.95"),
        Some(("--gpu-memory-utilization".to_owned(), Owner::Share))
    );
    assert_eq!(
        owned(Engine::Vllm, "--gpu-memory-util"),
        Some(("--gpu-memory-utilization".to_owned(), Owner::Share))
    );
    assert_eq!(
        owned(Engine::Vllm, "--host=0.0.0.0").map(|o| o.1),
        Some(Owner::Host)
    );
    assert_eq!(owned(Engine::Vllm, "-tp").map(|o| o.1), Some(Owner::Gpus));
    assert_eq!(
        owned(Engine::Sglang, "--mem-fraction-static").map(|o| o.1),
        Some(Owner::Share)
    );
    assert_eq!(
        owned(Engine::LlamaCpp, "-ngl").map(|o| o.1),
        Some(Owner::Share)
    );
    assert_eq!(
        owned(Engine::LlamaCpp, "--port").map(|o| o.1),
        Some(Owner::Port)
    );
    assert_eq!(
        owned(Engine::Vllm, "--served-model-name").map(|o| o.1),
        Some(Owner::Name)
    );
    assert_eq!(
        owned(Engine::LlamaCpp, "--alias").map(|o| o.1),
        Some(Owner::Name)
    );
    assert_eq!(owned(Engine::Vllm, "--max-model-len"), None);
    assert_eq!(owned(Engine::Vllm, "0.95"), None);
    assert_eq!(owned(Engine::LlamaCpp, "--ctx-size"), None);
    let template = Some("my-server --listen {port} --mem={gpu_memory_gb} --name x");
    assert_eq!(
        owned_flag(Engine::Command, template, "--listen"),
        Some(("--listen".to_owned(), Owner::Port))
    );
    assert_eq!(
        owned_flag(Engine::Command, template, "--mem=9"),
        Some(("--mem".to_owned(), Owner::Share))
    );
    assert_eq!(owned_flag(Engine::Command, template, "--name"), None);
}
