//! What an engine is started as: its recipe (vLLM, SGLang, llama.cpp or any command), turned into a program,
//! arguments and environment for the share it holds. Pure: the supervisor does the starting.

use crate::catalog::Engine;
use placement::holder::Holder;
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
    /// A node of the Ray cluster: the engine runs there as a job, listening on the node's loopback behind
    /// Tessera's guard on the node's address (`runtime::ray`).
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
    /// The address Tessera reaches an engine there on: its guard's, on a cluster's node.
    pub fn address(&self) -> &str {
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
    /// Wanted asleep (an on-demand member past its keep-alive): its engine runs, put to sleep, not
    /// started again. Not part of what it is: a sleep or a wake never restarts it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub asleep: bool,
}

/// How an engine is put to sleep and woken, where it can be: by the endpoints of the engine whose flag
/// its command line carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepApi {
    /// vLLM's `--enable-sleep-mode`: `POST /sleep?level=1`, `POST /wake_up` (served with
    /// `VLLM_SERVER_DEV_MODE=1`, which Tessera sets).
    Vllm,
    /// SGLang's `--enable-memory-saver` with `--enable-weights-cpu-backup` (its weights kept in host
    /// memory): `POST /release_memory_occupation`, `POST /resume_memory_occupation`.
    Sglang,
}

impl SleepApi {
    /// The path that puts it to sleep (level 1: weights to host memory, KV cache dropped).
    pub fn sleep_path(self) -> &'static str {
        match self {
            SleepApi::Vllm => "/sleep?level=1",
            SleepApi::Sglang => "/release_memory_occupation",
        }
    }

    /// The path that wakes it.
    pub fn wake_path(self) -> &'static str {
        match self {
            SleepApi::Vllm => "/wake_up",
            SleepApi::Sglang => "/resume_memory_occupation",
        }
    }
}

impl Recipe {
    /// How its engine sleeps, where its command line asks for sleep mode: whatever the engine field says,
    /// a `command` recipe that runs vLLM or SGLang with the flag sleeps as they do.
    pub fn sleep_api(&self) -> Option<SleepApi> {
        let words = || {
            self.command
                .iter()
                .flat_map(|c| c.split_whitespace())
                .chain(self.args.iter().map(String::as_str))
        };
        if words().any(|w| w == "--enable-sleep-mode") {
            Some(SleepApi::Vllm)
        } else if words().any(|w| w == "--enable-memory-saver")
            && words().any(|w| w == "--enable-weights-cpu-backup")
        {
            Some(SleepApi::Sglang)
        } else {
            None
        }
    }
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

/// The variable that gives an engine its key (the demo engine and a `command` engine's own server read it;
/// vLLM, SGLang and llama.cpp get `--api-key`).
pub const ENGINE_KEY_VAR: &str = "TESSERA_ENGINE_KEY";

/// Where every engine listens: on a cluster's node, behind the guard that takes requests from elsewhere.
const LOOPBACK: &str = "127.0.0.1";

/// What is added to an engine's command line to fit its share (`runtime::sizing`), and the line that
/// says so.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sizing {
    /// Arguments placed after Tessera's own and before the recipe's.
    pub args: Vec<String>,
    /// What was chosen and why, or why nothing was; `None` for engines Tessera does not size.
    pub note: Option<String>,
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
    /// The key only the gateway and the health probe send it (an engine on a cluster's node, reached on
    /// the node's address); never written anywhere, never shown.
    #[serde(skip)]
    pub api_key: Option<String>,
    /// The port the engine itself listens on: the one Tessera reaches it on, but on a cluster's node
    /// another, behind the guard on that one.
    #[serde(skip)]
    pub port: u16,
    /// How Tessera sized it to its share, where it chose something (llama.cpp's context), and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizing: Option<String>,
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
        self.keyed_command_line(port, free_at_start, None, &Sizing::default())
    }

    /// [`EngineSpec::command_line`], the engine to take only requests that carry `api_key`, where given,
    /// and sized as `sizing` says.
    fn keyed_command_line(
        &self,
        port: u16,
        free_at_start: Bytes,
        api_key: Option<&str>,
        sizing: &Sizing,
    ) -> Result<Launch, SpecError> {
        let (program, args) = self.argv(port, free_at_start, api_key, &sizing.args)?;
        Ok(Launch {
            program,
            args,
            env: self.env(port, api_key),
            api_key: api_key.map(str::to_owned),
            port,
            sizing: sizing.note.clone(),
        })
    }

    /// What the supervisor starts: the recipe on this machine, or the demo engine standing in for it on a
    /// simulated one (which runs even where the recipe has no command yet); taking only requests that
    /// carry `api_key`, where given, and sized as `sizing` says.
    pub fn launch(
        &self,
        port: u16,
        free_at_start: Bytes,
        demo_engine: &Path,
        api_key: Option<&str>,
        sizing: &Sizing,
    ) -> Result<Launch, SpecError> {
        if !self.host.made_up() {
            return self.keyed_command_line(port, free_at_start, api_key, sizing);
        }
        let mut args = vec!["demo-engine".to_owned(), "--".to_owned()];
        if let Ok((program, real)) = self.argv(port, free_at_start, api_key, &sizing.args) {
            args.push(program);
            args.extend(real);
        }
        Ok(Launch {
            program: demo_engine.display().to_string(),
            args,
            env: self.env(port, api_key),
            api_key: api_key.map(str::to_owned),
            port,
            sizing: sizing.note.clone(),
        })
    }

    /// The program and its arguments: Tessera's, then `sized` (what fits the share), then the recipe's.
    fn argv(
        &self,
        port: u16,
        free_at_start: Bytes,
        api_key: Option<&str>,
        sized: &[String],
    ) -> Result<(String, Vec<String>), SpecError> {
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
                    LOOPBACK,
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
                    LOOPBACK,
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
                    LOOPBACK,
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
                            .replace("{gpu_memory_gb}", &self.memory().gb_text_at_most())
                            .replace("{gpu_memory_fraction}", &fraction)
                            .replace("{api_key}", api_key.unwrap_or_default())
                    })
                    .collect();
                (program, args)
            }
        };
        args.extend(sized.iter().cloned());
        args.extend(r.args.iter().cloned());
        // After the recipe's own: the last value of a flag wins, and the gateway sends this one.
        if let (Some(key), Engine::Vllm | Engine::Sglang | Engine::LlamaCpp) = (api_key, r.engine) {
            args.extend(words(&["--api-key", key]));
        }
        Ok((program, args))
    }

    /// The recipe's environment with Tessera's variables, which win over it.
    fn env(&self, port: u16, api_key: Option<&str>) -> BTreeMap<String, String> {
        let mut env = self.recipe.env.clone();
        // Never more than the share: an engine sizes itself by it.
        env.insert(
            "TESSERA_GPU_MEMORY_GB".into(),
            self.memory().gb_text_at_most(),
        );
        env.insert(
            "TESSERA_GPU_MEMORY_BYTES".into(),
            self.memory().get().to_string(),
        );
        env.insert("CUDA_VISIBLE_DEVICES".into(), self.cuda_visible_devices());
        // The indices are NVML's, which count in PCI bus order; CUDA counts fastest first unless told.
        env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
        env.insert("TESSERA_PORT".into(), port.to_string());
        env.insert("TESSERA_HOST".into(), LOOPBACK.to_owned());
        env.insert("TESSERA_ENGINE".into(), self.unit.clone());
        if let Some(key) = api_key {
            env.insert(ENGINE_KEY_VAR.into(), key.to_owned());
        }
        // llama.cpp's --fit (on by default in recent builds) sizes what it is not told to the GPU's free
        // memory: on a shared GPU, the neighbours' room. Its variable, which a build without it ignores.
        if self.recipe.engine == Engine::LlamaCpp && self.share.is_some() {
            env.insert("LLAMA_ARG_FIT".into(), "off".into());
        }
        // vLLM serves its sleep endpoints only in its development mode.
        if self.recipe.sleep_api() == Some(SleepApi::Vllm) {
            env.insert("VLLM_SERVER_DEV_MODE".into(), "1".into());
        }
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
mod tests;
