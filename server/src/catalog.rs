//! The model catalog's types: a model the console offers to deploy, and the engine that runs it. Below the
//! fleet (which commits the catalog) and the runtime (which turns a recipe into a command line), so both
//! can name them; the demo fleet only seeds it (`inventory::demo::demo_catalog`).

use placement::BasisPoints;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The engine a model runs on, which decides how its share is passed to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM: the share becomes `--gpu-memory-utilization`.
    Vllm,
    /// SGLang: the share becomes `--mem-fraction-static`.
    Sglang,
    /// llama.cpp's server.
    LlamaCpp,
    /// Any command, which sizes itself by `TESSERA_GPU_MEMORY_GB`.
    Command,
}

/// A model the console offers to deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogModel {
    /// A unique name.
    pub name: String,
    /// What runs it.
    pub engine: Engine,
    /// The share of one GPU the deploy wizard proposes; percent in JSON, like every share of the API.
    #[serde(rename = "default_share_percent", with = "as_percent")]
    pub default_share: BasisPoints,
    /// The sharing group the model's recipe names, if any.
    pub group: Option<String>,
    /// Where the engine finds the model's weights.
    pub model_path: String,
    /// A system member (the semantic router): its share is shown but not edited, and it moves into a new
    /// group when one starts.
    #[serde(default)]
    pub system: bool,
    /// The command template of a `command` engine, such as `my-server --port {port} --model {model}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Extra arguments for every deployment of the model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables for every deployment of the model.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Names of environment variables (its own or a deployment's) whose values are secret beyond those
    /// named like one (`HF_TOKEN`, `*_API_KEY`): shown to admins only, never written to the audit log.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<String>,
}

/// A share as a percentage in JSON (`33.33`), read once into basis points.
mod as_percent {
    use placement::BasisPoints;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(share: &BasisPoints, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(share.as_percent_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BasisPoints, D::Error> {
        let percent = f64::deserialize(d)?;
        BasisPoints::from_percent(percent)
            .map_err(|e| serde::de::Error::custom(format!("default_share_percent {e}")))
    }
}
