//! What an engine is started as: its recipe (vLLM, SGLang, llama.cpp or any command), turned into a program,
//! arguments and environment for the share it holds. Pure: the supervisor does the starting.

use crate::catalog::Engine;
use crate::units::Holder;
use placement::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// How a model (or a worker's command) is run, whatever its share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    /// What runs it.
    pub engine: Engine,
    /// Where the engine finds the weights.
    pub model_path: String,
    /// The command template of a `command` engine, such as `my-server --port {port} --alias {name}`.
    pub command: Option<String>,
    /// Added after the engine's own arguments.
    pub args: Vec<String>,
    /// Added to the server's environment; Tessera's own variables win over these.
    pub env: BTreeMap<String, String>,
}

/// Where an engine runs, which decides what is started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Host {
    /// This machine: the recipe itself runs.
    Local,
    /// A machine of the demo fleet, which does not exist: the demo engine runs here in its place, told the
    /// command line the recipe would have run.
    Simulated,
    /// Another machine, where Tessera has no agent: nothing can be started.
    Remote,
    /// A node of the Ray cluster: the engine runs there as a job, listening on the node's address.
    Cluster {
        /// The node's address.
        address: String,
        /// Its GPUs' UUIDs by index: what `CUDA_VISIBLE_DEVICES` names them by there.
        uuids: BTreeMap<u32, String>,
        /// Its GPUs are made up: the demo engine stands in for the recipe, as on the demo fleet.
        demo: bool,
    },
}

impl Host {
    /// The address an engine there listens on.
    pub fn bind_address(&self) -> &str {
        match self {
            Host::Cluster { address, .. } => address,
            Host::Local | Host::Simulated | Host::Remote => "127.0.0.1",
        }
    }

    /// Whether Tessera runs real programs on real GPUs there, MPS daemons among them: this machine and a
    /// cluster's node, not the demo fleet, a node with made-up GPUs, or a machine it has no agent on.
    pub fn runs_daemons(&self) -> bool {
        matches!(self, Host::Local | Host::Cluster { demo: false, .. })
    }

    /// Whether its GPUs are made up (the demo fleet's, a Ray node's labelled demo): the demo engine stands
    /// in for what would run there.
    pub fn made_up(&self) -> bool {
        matches!(self, Host::Simulated | Host::Cluster { demo: true, .. })
    }
}

/// One engine the committed state says should run: a placed worker, or one member of a sharing group on
/// one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineSpec {
    /// The scheduler's holder name: a worker's name, or `group:{group}/{model}@{machine}`.
    pub unit: String,
    /// The machine.
    pub machine: String,
    /// Where that machine is, for the runtime.
    pub host: Host,
    /// The GPU indices on that machine.
    pub gpus: Vec<u32>,
    /// The memory of one of those GPUs.
    pub gpu_total: Bytes,
    /// The memory it may take on each GPU; `None` holds the GPUs whole.
    pub share: Option<Bytes>,
    /// What the least of its GPUs offers Tessera now (moves with NVML's readings; not part of what it is).
    pub gpu_offered: Bytes,
    /// What runs.
    pub recipe: Recipe,
    /// On a GPU shared under MPS: the GPU whose MPS server it is a client of, which holds it to its share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsClient>,
    /// Its GPUs that are MIG instances, by index: their UUIDs (`MIG-…`), which is how CUDA names an
    /// instance.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig: BTreeMap<u32, String>,
}

/// An engine as a client of its GPU's MPS server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsClient {
    /// The GPU's index on its machine.
    pub index: u32,
    /// The GPU's UUID, which its daemon is started for.
    pub uuid: String,
    /// The most of the GPU's threads it may use, in percent, where the operator set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u8>,
}

/// A spec that cannot be turned into a command line, said so that the operator knows what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A `command` engine (or a worker) without a command.
    #[error("{unit} has no command to run: give the worker a \"command\", or the model a command template")]
    NoCommand {
        /// The engine.
        unit: String,
    },
    /// The template does not split into words.
    #[error("the command of {unit} has an unclosed quote: {template}")]
    BadTemplate {
        /// The engine.
        unit: String,
        /// The template as given.
        template: String,
    },
}

/// A command line ready to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launch {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Added to the server's environment.
    pub env: BTreeMap<String, String>,
}

impl EngineSpec {
    /// What a change of this spec would change in the running engine: when this differs from what an engine
    /// was started as, it restarts. The port and the moment's free memory are left out.
    pub fn fingerprint(&self) -> String {
        let mut print = serde_json::json!({
            "machine": self.machine,
            "host": self.host,
            "gpus": self.gpus,
            "gpu_total": self.gpu_total.get(),
            "share": self.share.map(Bytes::get),
            "recipe": self.recipe,
        });
        // Only where there is one: an engine started before MPS or MIG existed keeps its fingerprint.
        if let Some(mps) = &self.mps {
            print["mps"] = serde_json::json!(mps);
        }
        if !self.mig.is_empty() {
            print["mig"] = serde_json::json!(self.mig);
        }
        print.to_string()
    }

    /// The machine and the MPS client a recorded engine was started as, read back from its fingerprint;
    /// none where no daemon runs (a demo machine's engines stand in without one).
    pub fn mps_of(fingerprint: &str) -> Option<(String, MpsClient)> {
        let print: serde_json::Value = serde_json::from_str(fingerprint).ok()?;
        // Read by its tag, not deserialized: serde cannot read a node's GPU map (integer keys) back
        // inside an internally tagged enum.
        let host = print.get("host")?;
        let daemons = match host.get("kind")?.as_str()? {
            "local" => true,
            "cluster" => host.get("demo")?.as_bool() == Some(false),
            _ => false,
        };
        if !daemons {
            return None;
        }
        Some((
            print.get("machine")?.as_str()?.to_owned(),
            serde_json::from_value(print.get("mps")?.clone()).ok()?,
        ))
    }

    /// This machine's GPUs a recorded engine was started on, read back from its fingerprint: where its
    /// stop waits for its memory to be free, as a started engine's does. None for an engine elsewhere (a
    /// demo machine's indices name nothing here).
    pub fn local_gpus_of(fingerprint: &str) -> Vec<u32> {
        let Ok(print) = serde_json::from_str::<serde_json::Value>(fingerprint) else {
            return Vec::new();
        };
        if print
            .pointer("/host/kind")
            .and_then(serde_json::Value::as_str)
            != Some("local")
        {
            return Vec::new();
        }
        serde_json::from_value(print["gpus"].clone()).unwrap_or_default()
    }

    /// The memory it takes on each of its GPUs.
    pub fn memory(&self) -> Bytes {
        self.share.unwrap_or(self.gpu_total)
    }

    /// The recipe's command line on `port`. `free_at_start` is the memory free on its GPUs as it starts
    /// (what SGLang sizes itself by).
    pub fn command_line(&self, port: u16, free_at_start: Bytes) -> Result<Launch, SpecError> {
        let (program, args) = self.argv(port, free_at_start)?;
        Ok(Launch {
            program,
            args,
            env: self.env(port),
        })
    }

    /// What the supervisor starts: the recipe on this machine, or the demo engine standing in for it on a
    /// simulated one (which runs even where the recipe has no command yet).
    pub fn launch(
        &self,
        port: u16,
        free_at_start: Bytes,
        demo_engine: &Path,
    ) -> Result<Launch, SpecError> {
        if !self.host.made_up() {
            return self.command_line(port, free_at_start);
        }
        let mut args = vec!["demo-engine".to_owned(), "--".to_owned()];
        if let Ok((program, real)) = self.argv(port, free_at_start) {
            args.push(program);
            args.extend(real);
        }
        Ok(Launch {
            program: demo_engine.display().to_string(),
            args,
            env: self.env(port),
        })
    }

    fn argv(&self, port: u16, free_at_start: Bytes) -> Result<(String, Vec<String>), SpecError> {
        let r = &self.recipe;
        let fraction = |of: Bytes| self.share.map(|share| fraction(share, of));
        let port_text = port.to_string();
        let tensor_parallel = (self.gpus.len() > 1).then(|| self.gpus.len().to_string());
        // The name the gateway asks the engine for: the model's (or the worker's), not the weights' path,
        // which vLLM and SGLang would otherwise answer to alone.
        let served = Holder::parse(&self.unit).name();
        let (program, mut args): (String, Vec<String>) = match r.engine {
            Engine::Vllm => {
                let mut args = words(&[
                    "serve",
                    &r.model_path,
                    "--host",
                    self.host.bind_address(),
                    "--port",
                    &port_text,
                    "--served-model-name",
                    served,
                ]);
                // vLLM's fraction is of the GPU's whole memory.
                if let Some(f) = fraction(self.gpu_total) {
                    args.extend(words(&["--gpu-memory-utilization", &f]));
                }
                if let Some(n) = &tensor_parallel {
                    args.extend(words(&["--tensor-parallel-size", n]));
                }
                ("vllm".to_owned(), args)
            }
            Engine::Sglang => {
                let mut args = words(&[
                    "-m",
                    "sglang.launch_server",
                    "--model-path",
                    &r.model_path,
                    "--host",
                    self.host.bind_address(),
                    "--port",
                    &port_text,
                    "--served-model-name",
                    served,
                ]);
                // SGLang's fraction is of the memory free when it starts, not of the GPU.
                if let Some(f) = fraction(free_at_start) {
                    args.extend(words(&["--mem-fraction-static", &f]));
                }
                if let Some(n) = &tensor_parallel {
                    args.extend(words(&["--tp-size", n]));
                }
                ("python3".to_owned(), args)
            }
            Engine::LlamaCpp => (
                "llama-server".to_owned(),
                words(&[
                    "-m",
                    &r.model_path,
                    "--host",
                    self.host.bind_address(),
                    "--port",
                    &port_text,
                    "--alias",
                    served,
                ]),
            ),
            Engine::Command => {
                let template = r.command.as_deref().ok_or_else(|| SpecError::NoCommand {
                    unit: self.unit.clone(),
                })?;
                let mut parts = shlex::split(template)
                    .ok_or_else(|| SpecError::BadTemplate {
                        unit: self.unit.clone(),
                        template: template.to_owned(),
                    })?
                    .into_iter();
                let program = parts.next().ok_or_else(|| SpecError::NoCommand {
                    unit: self.unit.clone(),
                })?;
                let fraction = fraction(self.gpu_total).unwrap_or_else(|| "1".to_owned());
                let args = parts
                    .map(|word| {
                        word.replace("{port}", &port_text)
                            .replace("{model}", &r.model_path)
                            .replace("{name}", served)
                            .replace("{gpu_memory_gb}", &self.memory().gb_text())
                            .replace("{gpu_memory_fraction}", &fraction)
                    })
                    .collect();
                (program, args)
            }
        };
        args.extend(r.args.iter().cloned());
        Ok((program, args))
    }

    /// The recipe's environment with Tessera's variables, which win over it.
    fn env(&self, port: u16) -> BTreeMap<String, String> {
        let mut env = self.recipe.env.clone();
        env.insert("TESSERA_GPU_MEMORY_GB".into(), self.memory().gb_text());
        env.insert("CUDA_VISIBLE_DEVICES".into(), self.cuda_visible_devices());
        // The indices are NVML's, which count in PCI bus order; CUDA counts fastest first unless told.
        env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
        env.insert("TESSERA_PORT".into(), port.to_string());
        env.insert("TESSERA_HOST".into(), self.host.bind_address().to_owned());
        env.insert("TESSERA_ENGINE".into(), self.unit.clone());
        env
    }

    /// Indices here, and a MIG instance's UUID; on a cluster's node, the GPUs' UUIDs, which mean the same
    /// whatever order that node's CUDA counts in.
    fn cuda_visible_devices(&self) -> String {
        self.gpus
            .iter()
            .map(|i| match (&self.host, self.mig.get(i)) {
                (_, Some(instance)) => instance.clone(),
                (Host::Cluster { uuids, .. }, None) => {
                    uuids.get(i).cloned().unwrap_or_else(|| i.to_string())
                }
                _ => i.to_string(),
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// What sets a flag Tessera gives an engine, which no extra argument may override: the last value of a
/// flag wins, so `--gpu-memory-utilization 0.95` after Tessera's own would take more than the share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The memory share.
    Share,
    /// The GPUs it runs on.
    Gpus,
    /// The recipe's path to the weights.
    ModelPath,
    /// The port Tessera chose.
    Port,
    /// The address it listens on.
    Host,
    /// The name it serves the model under, which the gateway asks for.
    Name,
}

/// The flags of each engine that Tessera sets, or that size it or choose its GPUs behind Tessera's back.
fn engine_flags(engine: Engine) -> &'static [(&'static str, Owner)] {
    use Owner::*;
    match engine {
        Engine::Vllm => &[
            ("--host", Host),
            ("--port", Port),
            ("--model", ModelPath),
            ("--served-model-name", Name),
            ("--gpu-memory-utilization", Share),
            ("--kv-cache-memory-bytes", Share),
            ("--cpu-offload-gb", Share),
            ("--tensor-parallel-size", Gpus),
            ("-tp", Gpus),
            ("--pipeline-parallel-size", Gpus),
            ("-pp", Gpus),
            ("--data-parallel-size", Gpus),
            ("-dp", Gpus),
        ],
        Engine::Sglang => &[
            ("--host", Host),
            ("--port", Port),
            ("--model-path", ModelPath),
            ("--served-model-name", Name),
            ("--mem-fraction-static", Share),
            ("--max-total-tokens", Share),
            ("--tp-size", Gpus),
            ("--tp", Gpus),
            ("--dp-size", Gpus),
            ("--dp", Gpus),
            ("--base-gpu-id", Gpus),
        ],
        Engine::LlamaCpp => &[
            ("--host", Host),
            ("--port", Port),
            ("-m", ModelPath),
            ("--model", ModelPath),
            ("-a", Name),
            ("--alias", Name),
            ("-ngl", Share),
            ("--gpu-layers", Share),
            ("--n-gpu-layers", Share),
            ("-ts", Gpus),
            ("--tensor-split", Gpus),
            ("-mg", Gpus),
            ("--main-gpu", Gpus),
            ("-sm", Gpus),
            ("--split-mode", Gpus),
            ("-dev", Gpus),
            ("--device", Gpus),
        ],
        Engine::Command => &[],
    }
}

/// The flag of Tessera's that `arg` would override, with what sets it. A `command` engine's are the flags
/// its template gives a placeholder (`--port {port}`, `--mem={gpu_memory_gb}`). Python's argument parser
/// takes `_` for `-` (vLLM) and an unambiguous abbreviation (`--gpu-memory-util`, `--ho`), so those count
/// too: any prefix of an owned long flag, however short, since Tessera does not know the engine's other
/// flags, and a prefix that is ambiguous among them is refused by the engine anyway.
pub fn owned_flag(engine: Engine, template: Option<&str>, arg: &str) -> Option<(String, Owner)> {
    let given = arg.split_once('=').map_or(arg, |(flag, _)| flag);
    if !given.starts_with('-') {
        return None;
    }
    let given = given.replace('_', "-");
    let python = matches!(engine, Engine::Vllm | Engine::Sglang);
    let matches = |flag: &str| {
        given == flag
            || (python && flag.starts_with("--") && given.len() > 2 && flag.starts_with(&given))
    };
    if let Some((flag, owner)) = engine_flags(engine).iter().find(|(flag, _)| matches(flag)) {
        return Some(((*flag).to_owned(), *owner));
    }
    let words = template.and_then(shlex::split).unwrap_or_default();
    let placeholder = |word: &str| {
        [
            ("{port}", Owner::Port),
            ("{model}", Owner::ModelPath),
            ("{name}", Owner::Name),
            ("{gpu_memory_gb}", Owner::Share),
            ("{gpu_memory_fraction}", Owner::Share),
        ]
        .into_iter()
        .find(|(p, _)| word.contains(p))
        .map(|(_, owner)| owner)
    };
    words.iter().enumerate().find_map(|(i, word)| {
        let (flag, owner) = match word.split_once('=') {
            Some((flag, value)) => (flag, placeholder(value)?),
            None => (word.as_str(), placeholder(words.get(i + 1)?)?),
        };
        (flag.starts_with('-') && given == flag.replace('_', "-")).then(|| (flag.to_owned(), owner))
    })
}

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|&w| w.to_owned()).collect()
}

/// `share / of` with four decimals, rounded down so that an engine never takes more than its share; at
/// most 1. A share is itself rounded down to whole bytes (30 % of 96 GiB is 0.2 byte short): the numerator
/// gets those bytes back, so that 30 % reads 0.3 and not 0.2999; it moves the result by under one byte.
fn fraction(share: Bytes, of: Bytes) -> String {
    if of == Bytes::ZERO || share >= of {
        return "1".to_owned();
    }
    let ten_thousandths = (u128::from(share.get()) * 10_000 + 10_000) / u128::from(of.get());
    let ten_thousandths = ten_thousandths.min(9_999);
    // Display of an f64 is its shortest exact form: 3000 / 10 000 reads 0.3.
    (ten_thousandths as f64 / 10_000.0).to_string()
}

#[cfg(test)]
mod tests {
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
        }
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
            .launch(8001, Bytes::gb(80), Path::new("/bin/tessera"))
            .unwrap();
        assert_eq!(launch.program, "/bin/tessera");
        assert_eq!(&launch.args[..4], ["demo-engine", "--", "vllm", "serve"]);
        assert_eq!(launch.env["TESSERA_GPU_MEMORY_GB"], "32");
        // Without a command of its own, a simulated worker still runs: the demo engine stands in for nothing.
        s.recipe.engine = Engine::Command;
        let launch = s.launch(1, Bytes::ZERO, Path::new("/bin/tessera")).unwrap();
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
}
