//! The demo fleet (`--demo`) and a sample model catalog, for trying Tessera on a machine without GPUs.
//!
//! The fleet covers each case the rules treat differently: a small desktop GPU with memory held outside, a
//! Windows PC under WSL2 where every container sees every GPU, a node with two large GPUs, and an 8-GPU
//! data-centre node.

use placement::mig::{instance, Layout};
use placement::units::GB;
use placement::{BasisPoints, Bytes, Gpu, Machine, MigRole};
use std::collections::BTreeMap;

use crate::catalog::{CatalogModel, Engine};

/// The demo fleet: majin, studio (WSL2), atlas and h200-node.
pub fn demo_fleet() -> Vec<Machine> {
    vec![
        Machine {
            name: "majin".into(),
            cpu_cores: 16,
            memory: Bytes::gb(64),
            all_gpus_visible: false,
            gpus: vec![Gpu {
                held_outside: Bytes::gb(1),
                ..gpu(
                    0,
                    "GPU-5f3c2a9e-7b1d-4c8e-9a2f-1d6e8b4c7a30",
                    "NVIDIA GeForce RTX 4060",
                    8,
                )
            }],
        },
        Machine {
            name: "studio".into(),
            cpu_cores: 32,
            memory: Bytes::gb(128),
            all_gpus_visible: true,
            gpus: vec![
                Gpu {
                    // The Windows desktop draws 0.8 GB on the first GPU.
                    held_outside: Bytes(GB * 4 / 5),
                    ..gpu(
                        0,
                        "GPU-a81e4f07-2c95-4d3b-b6e1-0f7c9d2e5a48",
                        "NVIDIA GeForce RTX 4090",
                        24,
                    )
                },
                gpu(
                    1,
                    "GPU-3d7b9c12-e4a6-4f58-8c0d-6b2e1a9f4c75",
                    "NVIDIA GeForce RTX 3060",
                    12,
                ),
            ],
        },
        Machine {
            name: "atlas".into(),
            cpu_cores: 64,
            memory: Bytes::gb(512),
            all_gpus_visible: false,
            gpus: vec![
                gpu(
                    0,
                    "GPU-c42f8e6a-91b3-4d7e-a5c8-2e0f6b3d9a17",
                    "NVIDIA RTX PRO 6000 Blackwell",
                    96,
                ),
                gpu(
                    1,
                    "GPU-7e1a5d93-0c4b-4e2f-9d86-b3a7f1c5e042",
                    "NVIDIA RTX PRO 6000 Blackwell",
                    96,
                ),
            ],
        },
        Machine {
            name: "h200-node".into(),
            cpu_cores: 192,
            memory: Bytes::gb(2048),
            all_gpus_visible: false,
            gpus: H200_UUIDS
                .iter()
                .zip(0..)
                .map(|(uuid, index)| gpu(index, uuid, "NVIDIA H200", 141))
                .collect(),
        },
    ]
}

const H200_UUIDS: [&str; 8] = [
    "GPU-0b9e3f71-4a2c-4d8e-b1f6-9c5a7e2d3b80",
    "GPU-1c8d4e62-5b3d-4e9f-a2e7-8d6b9f3c4a91",
    "GPU-2d7c5f53-6c4e-4fa0-b3d8-7e5c8a4d5ba2",
    "GPU-3e6b6a44-7d5f-40b1-84c9-6f4d7b5e6cb3",
    "GPU-4f5a7b35-8e60-41c2-95da-5a3e6c6f7dc4",
    "GPU-5a4b8c26-9f71-42d3-a6eb-4b2f5d7a8ed5",
    "GPU-6b3c9d17-a082-43e4-b7fc-3c1a4e8b9fe6",
    "GPU-7c2dae08-b193-44f5-880d-2d0b3f9caa07",
];

/// `machine` with made-up GPU `index` cut into `layout`'s instances, as the driver would list them: the GPU
/// takes no work, and each instance is a GPU of its own, numbered under it, with its profile's memory.
/// Whatever instances it had before are gone.
pub fn cut(machine: &Machine, index: u32, layout: &Layout) -> Machine {
    let mut machine = join(machine, index);
    let Some(parent) = machine.gpus.iter_mut().find(|g| g.index == index) else {
        return machine;
    };
    parent.mig = Some(MigRole::Cut);
    let parent = parent.clone();
    // The driver's form of a UUID, MIG- and one of its own: made up from the GPU's and the instance's number.
    let instances = layout.instances.iter().zip(0..).map(|(placed, n)| {
        let uuid = format!("MIG-{}-{n}", parent.uuid.trim_start_matches("GPU-"));
        instance(&parent, n, &placed.profile, uuid)
    });
    machine.gpus.extend(instances);
    machine
}

/// `machine` with made-up GPU `index` whole again: its instances gone.
pub fn join(machine: &Machine, index: u32) -> Machine {
    let mut machine = machine.clone();
    machine.gpus.retain(|g| !g.is_instance_of(index));
    for gpu in machine.gpus.iter_mut().filter(|g| g.index == index) {
        gpu.mig = None;
    }
    machine
}

/// A healthy NVIDIA GPU with nothing held outside.
fn gpu(index: u32, uuid: &str, model: &str, total_gb: u64) -> Gpu {
    Gpu {
        index,
        uuid: uuid.into(),
        model: model.into(),
        vendor: "nvidia".into(),
        total: Bytes::gb(total_gb),
        held_outside: Bytes::ZERO,
        healthy: true,
        mig: None,
    }
}

/// A small catalog: a text router and the LLM it routes to (one sharing group), and three models that
/// each start a group of their own.
pub fn demo_catalog() -> Vec<CatalogModel> {
    let model = |name: &str, engine, percent, group: Option<&str>, model_path: &str| CatalogModel {
        name: name.into(),
        engine,
        default_share: BasisPoints::percent(percent),
        group: group.map(Into::into),
        model_path: model_path.into(),
        system: name == "semantic-router",
        command: None,
        args: Vec::new(),
        env: BTreeMap::new(),
        secret_env: Vec::new(),
    };
    vec![
        model(
            "semantic-router",
            Engine::Command,
            10,
            Some("text-router"),
            "models/semantic-router",
        ),
        model(
            "glm-5.3",
            Engine::Vllm,
            40,
            Some("text-router"),
            "zai-org/GLM-5.3",
        ),
        model(
            "vision",
            Engine::Sglang,
            25,
            None,
            "Qwen/Qwen2.5-VL-7B-Instruct",
        ),
        model("speech", Engine::LlamaCpp, 10, None, "models/speech.gguf"),
        model("embedder", Engine::Command, 5, None, "BAAI/bge-m3"),
    ]
    .into_iter()
    .map(|mut m| {
        m.command = match m.name.as_str() {
            "semantic-router" => {
                Some("semantic-router serve --port {port} --config {model}".into())
            }
            // Hugging Face's text-embeddings-inference.
            "embedder" => Some("text-embeddings-router --model-id {model} --port {port}".into()),
            _ => None,
        };
        m
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use placement::Inventory;

    #[test]
    fn the_demo_fleet_is_a_valid_inventory() {
        let inventory = Inventory::new(demo_fleet()).unwrap();
        let names: Vec<_> = inventory
            .machines()
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, ["atlas", "h200-node", "majin", "studio"]);
    }

    #[test]
    fn majin_offers_7_of_its_8_gb() {
        let fleet = demo_fleet();
        let majin = fleet.iter().find(|m| m.name == "majin").unwrap();
        assert_eq!(majin.gpus[0].total, Bytes::gb(8));
        assert_eq!(majin.gpus[0].offered(), Bytes::gb(7));
    }

    #[test]
    fn the_wsl2_pc_has_all_gpus_visible_and_its_desktop_holds_0_8_gb() {
        let fleet = demo_fleet();
        let studio = fleet.iter().find(|m| m.name == "studio").unwrap();
        assert!(studio.all_gpus_visible);
        assert_eq!(studio.gpus[0].held_outside, Bytes::from_gb(0.8).unwrap());
        assert!(fleet.iter().filter(|m| m.all_gpus_visible).count() == 1);
    }

    #[test]
    fn the_h200_node_has_eight_141_gb_gpus_with_distinct_uuids() {
        let fleet = demo_fleet();
        let node = fleet.iter().find(|m| m.name == "h200-node").unwrap();
        assert_eq!(node.gpus.len(), 8);
        assert!(node.gpus.iter().all(|g| g.total == Bytes::gb(141)));
        let mut uuids: Vec<_> = fleet
            .iter()
            .flat_map(|m| m.gpus.iter().map(|g| g.uuid.as_str()))
            .collect();
        let count = uuids.len();
        uuids.sort_unstable();
        uuids.dedup();
        assert_eq!(uuids.len(), count);
    }

    #[test]
    fn the_catalog_has_unique_names_and_its_shared_group_fits_one_gpu() {
        let catalog = demo_catalog();
        let mut names: Vec<_> = catalog.iter().map(|m| m.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), catalog.len());
        let router_group: BasisPoints = catalog
            .iter()
            .filter(|m| m.group.as_deref() == Some("text-router"))
            .map(|m| m.default_share)
            .sum();
        assert_eq!(router_group, BasisPoints::percent(50));
    }

    #[test]
    fn engines_are_written_in_lower_case() {
        let names: Vec<_> = [
            Engine::Vllm,
            Engine::Sglang,
            Engine::LlamaCpp,
            Engine::Command,
        ]
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
        assert_eq!(
            names,
            [r#""vllm""#, r#""sglang""#, r#""llamacpp""#, r#""command""#]
        );
    }
}
