//! Who may give an engine what (docs/src/security.md, "Who may run what"). Engines run as the server's user, so whatever
//! can choose a program, a library it loads or the interpreter's search path can do anything that user
//! can: that is an admin's. An operator deploys catalog models and tunes them with extra arguments and
//! environment variables that cannot do so, and that cannot take more than the share Tessera gave them.
//!
//! Secrets (tokens, keys, passwords) in an engine's environment or arguments are shown to admins only, and
//! never written to the audit log.

use crate::catalog::{CatalogModel, Engine};
use crate::error::ApiError;
use crate::runtime::spec::{owned_flag, Owner};
use app::auth::{Caller, Role};
use std::collections::BTreeMap;

pub use crate::redact::{
    is_secret, keep_secrets, redact_args, redact_env, redact_json, redact_line, secret_values,
    REDACTED,
};

/// What a caller may see of secrets: an admin all of them, anyone else their names only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sight {
    /// An admin.
    Secrets,
    /// Everyone else.
    Redacted,
}

impl Sight {
    /// What `caller` may see.
    pub fn of(caller: &Caller) -> Sight {
        if caller.role == Role::Admin {
            Sight::Secrets
        } else {
            Sight::Redacted
        }
    }
}

/// Environment variables that load code or change where it is found or fetched from: an admin's. Compared
/// in upper case; a name that starts with one of `PREFIXES` counts too.
const ADMIN_VARS: &[&str] = &[
    "PATH",
    "ENV",
    "BASH_ENV",
    "SHELL",
    "HOME",
    "IFS",
    "PS4",
    "PROMPT_COMMAND",
    "TMPDIR",
    "LIBRARY_PATH",
    "CPATH",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "HF_ENDPOINT",
    "TRITON_CACHE_DIR",
    "VLLM_PLUGINS",
    "SGLANG_EXTERNAL_MODEL_PACKAGE",
    "TRANSFORMERS_TRUST_REMOTE_CODE",
];
const ADMIN_PREFIXES: &[&str] = &[
    "LD_", "DYLD_", "PYTHON", "PERL", "RUBY", "NODE_", "GCONV", "GLIBC_", "MALLOC_", "SSL_",
    "NCCL_NET", "CUDA_MPS",
];

/// The flags an operator may give an engine: tuning (context, sequences, batches, cache types, prefix
/// caching, quantization, threads, sampling defaults, logging), none that runs code (`--trust-remote-code`,
/// SGLang's `--enable-custom-logit-processor`, vLLM's plugins and `--middleware`), reads or writes a file
/// the operator names (chat templates, LoRA adapters, `--slot-save-path`), downloads, or opens an endpoint.
/// Anything else is an admin's. Matched written out in full, as `flag` or `flag=value` (and `_` for `-`):
/// Python's parser takes any unambiguous abbreviation, which could name a flag not listed here.
fn tuning_flags(engine: Engine) -> &'static [&'static str] {
    match engine {
        Engine::Vllm => &[
            "--max-model-len",
            "--max-num-seqs",
            "--max-num-batched-tokens",
            "--max-seq-len-to-capture",
            "--kv-cache-dtype",
            "--block-size",
            "--enable-prefix-caching",
            "--no-enable-prefix-caching",
            "--enable-chunked-prefill",
            "--no-enable-chunked-prefill",
            "--quantization",
            "-q",
            "--dtype",
            "--enforce-eager",
            "--swap-space",
            "--cpu-offload-gb",
            "--seed",
            "--max-logprobs",
            "--scheduling-policy",
            "--tokenizer-mode",
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "--reasoning-parser",
            "--disable-log-requests",
            "--disable-log-stats",
            "--uvicorn-log-level",
        ],
        Engine::Sglang => &[
            "--context-length",
            "--max-running-requests",
            "--max-prefill-tokens",
            "--chunked-prefill-size",
            "--kv-cache-dtype",
            "--quantization",
            "--dtype",
            "--disable-radix-cache",
            "--schedule-policy",
            "--schedule-conservativeness",
            "--disable-cuda-graph",
            "--cuda-graph-max-bs",
            "--attention-backend",
            "--sampling-backend",
            "--random-seed",
            "--stream-interval",
            "--tool-call-parser",
            "--reasoning-parser",
            "--log-level",
            "--log-requests",
        ],
        Engine::LlamaCpp => &[
            "-c",
            "--ctx-size",
            "-np",
            "--parallel",
            "-ctk",
            "--cache-type-k",
            "-ctv",
            "--cache-type-v",
            "-kvu",
            "--kv-unified",
            "--swa-full",
            "-fa",
            "--flash-attn",
            "-b",
            "--batch-size",
            "-ub",
            "--ubatch-size",
            "-t",
            "--threads",
            "-tb",
            "--threads-batch",
            "-cb",
            "--cont-batching",
            "-nocb",
            "--no-cont-batching",
            "--cache-reuse",
            "-nkvo",
            "--no-kv-offload",
            "--mlock",
            "--no-mmap",
            "-n",
            "--n-predict",
            "--temp",
            "--top-k",
            "--top-p",
            "--min-p",
            "--repeat-penalty",
            "-s",
            "--seed",
            "--jinja",
            "--reasoning-format",
            "--reasoning-budget",
            "--rope-scaling",
            "--rope-freq-base",
            "--rope-freq-scale",
            "--embedding",
            "--embeddings",
            "--pooling",
            "--reranking",
            "--rerank",
            "--metrics",
            "-lv",
            "--log-verbosity",
            "--log-disable",
            "-to",
            "--timeout",
        ],
        // A command recipe's program is an admin's, and Tessera knows none of its flags.
        Engine::Command => &[],
    }
}

/// The variables an operator may give an engine: threads, logging, allocator tuning and the hub's token.
/// Anything else is an admin's.
const TUNING_VARS: &[&str] = &[
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "NCCL_DEBUG",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "VLLM_LOGGING_LEVEL",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_FLASHINFER_SAMPLER",
    "VLLM_FLASH_ATTN_VERSION",
    "VLLM_ENGINE_ITERATION_TIMEOUT_S",
    "VLLM_LOG_STATS_INTERVAL",
    "SGLANG_LOG_LEVEL",
    "LLAMA_LOG_VERBOSITY",
    "LLAMA_LOG_COLORS",
];

/// Whether setting the variable `name` needs the admin role.
pub fn needs_admin(name: &str) -> bool {
    let name = name.to_ascii_uppercase();
    ADMIN_VARS.contains(&name.as_str()) || ADMIN_PREFIXES.iter().any(|p| name.starts_with(p))
}

fn forbidden(caller: &Caller, what: &str) -> ApiError {
    ApiError::Forbidden(format!(
        "{} is {}: {what}, which needs the admin role",
        caller.name,
        caller.role.with_article()
    ))
}

/// Extra arguments and environment that `caller` gives `model`'s engines: none may override a flag
/// Tessera sets (whoever asks), and only an admin may load code.
pub fn check_serving(
    caller: &Caller,
    model: &CatalogModel,
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    check_args(
        model.engine,
        model.command.as_deref(),
        args,
        "extra argument",
    )?;
    if caller.role == Role::Admin {
        return Ok(());
    }
    if let Some(name) = env
        .keys()
        .find(|name| !TUNING_VARS.contains(&name.to_ascii_uppercase().as_str()))
    {
        return Err(forbidden(
            caller,
            &format!(
                "the environment variable {name} is not one an operator may give an engine \
                 (docs/src/security.md lists them)"
            ),
        ));
    }
    if let Some(flag) = args
        .iter()
        .filter_map(|arg| flag_of(arg))
        .find(|flag| !tuning_flags(model.engine).contains(&flag.as_str()))
    {
        return Err(forbidden(
            caller,
            &format!(
                "{flag} is not one of the tuning flags an operator may give {} engine, written out in \
                 full (docs/src/security.md lists them)",
                match model.engine {
                    Engine::Vllm => "a vLLM",
                    Engine::Sglang => "an SGLang",
                    Engine::LlamaCpp => "a llama.cpp",
                    Engine::Command => "a command recipe's",
                }
            ),
        ));
    }
    Ok(())
}

/// The flag `arg` is, as an engine's parser reads it (`--flag=value`, `_` for `-`); `None` for a value,
/// a negative number included.
fn flag_of(arg: &str) -> Option<String> {
    let flag = arg.split_once('=').map_or(arg, |(flag, _)| flag);
    let rest = flag.strip_prefix('-')?;
    if rest.is_empty() || rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
        return None;
    }
    Some(flag.replace('_', "-"))
}

/// A recipe's own arguments, like extra ones, may not override what Tessera sets.
pub fn check_recipe_args(model: &CatalogModel) -> Result<(), ApiError> {
    check_args(model.engine, model.command.as_deref(), &model.args, "args")
}

fn check_args(
    engine: Engine,
    template: Option<&str>,
    args: &[String],
    field: &str,
) -> Result<(), ApiError> {
    for (i, arg) in args.iter().enumerate() {
        if let Some((flag, owner)) = owned_flag(engine, template, arg) {
            let whose = match owner {
                Owner::Share => "the share (\"share\", or \"shares\" in a plan) sets it",
                Owner::Gpus => "the GPUs chosen (\"gpus\") set it",
                Owner::ModelPath => "the catalog recipe's \"model_path\" sets it",
                Owner::Port => "Tessera gives each engine its port, where health checks find it",
                Owner::Host => "Tessera has engines listen on 127.0.0.1 only",
                Owner::Name => "Tessera serves the model under its name in the catalog, as the gateway asks for it",
            };
            let what = if field == "args" {
                format!("args[{i}]")
            } else {
                format!("{field} {}", i + 1)
            };
            return Err(ApiError::Unprocessable(format!(
                "{what} ({arg}) overrides {flag}, which Tessera sets: {whose}; remove it"
            )));
        }
    }
    Ok(())
}

/// A worker's own command is a program of the caller's choosing: an admin's.
pub fn check_command(caller: &Caller, command: Option<&str>) -> Result<(), ApiError> {
    match command {
        Some(_) if caller.role != Role::Admin => Err(forbidden(
            caller,
            "a worker's \"command\" runs a program of your choosing",
        )),
        _ => Ok(()),
    }
}

/// Environment a worker sets for itself, checked as a deployment's is.
pub fn check_worker_env(caller: &Caller, env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    match env.keys().find(|name| needs_admin(name)) {
        Some(name) if caller.role != Role::Admin => Err(forbidden(
            caller,
            &format!("the environment variable {name} changes what code the engine loads"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_loading_variables_are_an_admins_and_tuning_ones_are_not() {
        for admin in [
            "LD_PRELOAD",
            "ld_library_path",
            "PATH",
            "PYTHONPATH",
            "PYTHONSTARTUP",
            "https_proxy",
            "BASH_ENV",
        ] {
            assert!(needs_admin(admin), "{admin}");
        }
        for anyone in [
            "VLLM_LOGGING_LEVEL",
            "HF_HOME",
            "OMP_NUM_THREADS",
            "HF_TOKEN",
            "NCCL_DEBUG",
        ] {
            assert!(!needs_admin(anyone), "{anyone}");
        }
    }

    #[test]
    fn secrets_are_known_by_their_name_or_the_recipes_word() {
        for secret in [
            "HF_TOKEN",
            "OPENAI_API_KEY",
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "--api-key",
        ] {
            assert!(is_secret(secret, &[]), "{secret}");
        }
        assert!(!is_secret("HF_HOME", &[]));
        assert!(is_secret("LICENSE", &["LICENSE".to_owned()]));
    }

    #[test]
    fn a_secret_flags_value_is_redacted_in_either_form() {
        let args: Vec<String> = [
            "--api-key",
            "sk-1234",
            "--max-model-len",
            "4096",
            "--hf-token=hf_abcd",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            redact_args(&args),
            [
                "--api-key",
                REDACTED,
                "--max-model-len",
                "4096",
                "--hf-token=(secret)"
            ]
        );
        let env = BTreeMap::from([("HF_TOKEN".to_owned(), "hf_secret_value".to_owned())]);
        let secrets = secret_values(&env, &args, &[]);
        assert_eq!(
            redact_line("token hf_secret_value and sk-1234 and hf_abcd", &secrets),
            "token (secret) and (secret) and (secret)"
        );
    }

    #[test]
    fn an_audit_entry_keeps_no_secret_at_any_depth() {
        let entry = serde_json::json!({
            "model": "m",
            "serving": {"args": ["--api-key", "sk-1"], "env": {"HF_TOKEN": "hf_1", "HF_HOME": "/m", "LIC": "x"}},
        });
        assert_eq!(
            redact_json(entry, &["LIC".to_owned()]),
            serde_json::json!({
                "model": "m",
                "serving": {"args": ["--api-key", REDACTED], "env": {"HF_TOKEN": REDACTED, "HF_HOME": "/m", "LIC": REDACTED}},
            })
        );
    }

    #[test]
    fn a_form_that_sends_the_redacted_value_back_keeps_the_secret() {
        let stored = BTreeMap::from([("HF_TOKEN".to_owned(), "hf_real".to_owned())]);
        let mut sent = BTreeMap::from([
            ("HF_TOKEN".to_owned(), REDACTED.to_owned()),
            ("OTHER".to_owned(), REDACTED.to_owned()),
        ]);
        keep_secrets(&mut sent, &stored);
        assert_eq!(sent["HF_TOKEN"], "hf_real");
        assert_eq!(sent["OTHER"], REDACTED, "nothing stored to keep");
    }
}
