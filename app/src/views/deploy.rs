//! The Deploy a model wizard: the catalog and nodes it judges a deploy against, the request it sends, and a
//! model's serving configuration, which the Serving form changes later.

use super::groups::GroupPlan;
use super::machines::Sharer;
use placement::{BasisPoints, Bytes, GpuRef, GroupGpu};
use serde::{Deserialize, Serialize};

/// A catalog model the wizard offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// Its name.
    pub name: String,
    /// What runs it: `vllm`, `sglang`, `llamacpp` or `command`.
    pub engine: String,
    /// The share the wizard proposes.
    pub default_share: BasisPoints,
    /// The sharing group its recipe names.
    pub group: Option<String>,
    /// The semantic router.
    pub system: bool,
    /// Whether it runs already (a model runs once).
    pub deployed: bool,
}

/// A GPU as the wizard weighs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuOption {
    /// Its index.
    pub index: u32,
    /// Its model name.
    pub model: String,
    /// All its memory.
    pub total: Bytes,
    /// Memory held outside Tessera.
    pub held_outside: Bytes,
    /// Whether it is healthy.
    pub healthy: bool,
    /// Held whole by someone: shared work cannot go there.
    pub held_whole: bool,
    /// What each sharer takes, with its group (none for a shared worker).
    pub sharers: Vec<Sharer>,
}

impl GpuOption {
    /// The GPU as a plan for `group` is judged against it: shared work outside the group counts against it.
    pub fn for_group(&self, machine: &str, group: Option<&str>) -> GroupGpu {
        GroupGpu::of(
            GpuRef::new(machine, self.index),
            self.total,
            self.held_outside,
            self.sharers.iter().map(|s| (s.group.as_deref(), s.bytes)),
            group,
        )
    }

    /// Whether nothing holds it at all.
    pub fn is_free(&self) -> bool {
        !self.held_whole && self.sharers.is_empty()
    }
}

/// A node as the wizard offers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOption {
    /// The machine.
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<GpuOption>,
}

/// What the Deploy a model wizard needs to judge a deploy in the browser.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployOptions {
    /// The catalog.
    pub catalog: Vec<CatalogEntry>,
    /// Every node with GPUs.
    pub nodes: Vec<NodeOption>,
    /// Every sharing group.
    pub groups: Vec<GroupPlan>,
}

/// A model's serving configuration: extra arguments and environment variables for its engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serving {
    /// Added after the engine's own arguments, one per entry.
    pub args: Vec<String>,
    /// Added to the engine's environment.
    pub env: Vec<(String, String)>,
}

/// A deploy from the wizard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployRequest {
    /// The catalog model.
    pub model: String,
    /// Share GPUs with a group (on), or take them whole (off).
    pub shared: bool,
    /// The GPUs: the group's, or the ones chosen on each node.
    pub gpus: Vec<GpuRef>,
    /// The model's share, when shared.
    pub share: Option<BasisPoints>,
    /// New shares of other members of the group it joins (only those that change).
    pub shares: Vec<(String, BasisPoints)>,
    /// Whether it is pinned or loaded on demand.
    #[serde(default)]
    pub demand: placement::Demand,
    /// New demand of other members of the group it joins (only those that change).
    #[serde(default)]
    pub demands: Vec<(String, placement::Demand)>,
    /// The revision of the group it joins, as the wizard read it.
    pub revision: Option<i64>,
    /// Its serving configuration.
    pub serving: Serving,
    /// Replicas that follow its load, when shared, each on a GPU of its own; none: one engine on each
    /// machine of its group, across its GPUs there.
    #[serde(default)]
    pub replicas: Option<placement::scale::Autoscale>,
}

/// The Serving configuration form of a running model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServingForm {
    /// The model.
    pub model: String,
    /// What runs it: `vllm`, `sglang`, `llamacpp` or `command`.
    #[serde(default)]
    pub engine: String,
    /// Its group.
    pub group: Option<String>,
    /// The revision a change must name (its group's).
    pub revision: i64,
    /// Every node, as the wizard offers them.
    pub nodes: Vec<NodeOption>,
    /// The GPUs it runs on.
    pub placed: Vec<GpuRef>,
    /// Its serving configuration today.
    pub serving: Serving,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_judged_against_shared_work_outside_it_only() {
        let gpu = GpuOption {
            index: 0,
            model: "H200".into(),
            total: Bytes::gb(141),
            held_outside: Bytes::ZERO,
            healthy: true,
            held_whole: false,
            sharers: vec![
                Sharer {
                    name: "listen".into(),
                    group: None,
                    bytes: Bytes::gb(2),
                },
                Sharer {
                    name: "glm-5.3".into(),
                    group: Some("text-router".into()),
                    bytes: Bytes::gb(50),
                },
            ],
        };
        assert_eq!(
            gpu.for_group("h200-node", Some("text-router"))
                .taken_by_others,
            Bytes::gb(2)
        );
        assert_eq!(
            gpu.for_group("h200-node", None).taken_by_others,
            Bytes::gb(52)
        );
    }
}

/// What a model's memory estimate asks: the inputs llama.cpp would be given, and where it would run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EstimateQuery {
    /// The catalog model.
    pub model: String,
    /// The machine it would run on, whose copy of its file is read.
    pub machine: Option<String>,
    /// Each slot's context in tokens; the model's own when `None`.
    pub context: Option<u32>,
    /// Requests served at once.
    pub slots: u32,
    /// The KV cache type of keys and values, as llama.cpp names it (`f16`, `q8_0`).
    pub cache_type: String,
}

/// A model's memory estimate, or why it has none: never a made-up one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EstimateAnswer {
    /// Estimated from the model's file.
    Estimated(Box<placement::estimate::Estimate>),
    /// Not estimated, and why (no such file here, not GGUF, a safetensors folder, a file on a node).
    NotEstimated(String),
}
