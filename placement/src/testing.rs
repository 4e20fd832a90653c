//! Fleets for tests.

use crate::inventory::{Gpu, Machine};
use crate::units::Bytes;

/// An NVIDIA GPU with `gb` GB, healthy, nothing held outside.
pub fn gpu(index: u32, gb: u64) -> Gpu {
    Gpu {
        index,
        uuid: format!("GPU-{index}"),
        model: "NVIDIA GeForce RTX 4060".into(),
        vendor: "nvidia".into(),
        total: Bytes::gb(gb),
        held_outside: Bytes::ZERO,
        healthy: true,
        mig: None,
    }
}

/// A machine with 64 cores, 512 GB and one GPU per entry of `gpus_gb`.
pub fn machine(name: &str, gpus_gb: &[u64]) -> Machine {
    Machine {
        name: name.into(),
        cpu_cores: 64,
        memory: Bytes::gb(512),
        all_gpus_visible: false,
        gpus: gpus_gb
            .iter()
            .enumerate()
            .map(|(i, &gb)| gpu(i as u32, gb))
            .collect(),
    }
}

/// Seed 000's majin: 16 cores, 64 GB, an 8 GB RTX 4060 whose desktop holds 1 GB.
pub fn majin() -> Machine {
    let mut m = machine("majin", &[8]);
    m.cpu_cores = 16;
    m.memory = Bytes::gb(64);
    m.gpus[0].held_outside = Bytes::gb(1);
    m
}
