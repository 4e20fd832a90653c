//! What the placement benches share: a fleet of machines of eight 80 GB H100s.

use placement::{Bytes, Gpu, Inventory, Machine};

/// `machines` machines named `{prefix}{n:04}`, each with `cpu_cores`, `memory` and eight 80 GB H100s, of
/// which GPU `index` has `held_outside(index)` taken by other programs.
pub fn h100s(
    machines: usize,
    prefix: &str,
    cpu_cores: u32,
    memory: Bytes,
    held_outside: impl Fn(u32) -> Bytes,
) -> Inventory {
    let machines = (0..machines)
        .map(|m| Machine {
            name: format!("{prefix}{m:04}"),
            cpu_cores,
            memory,
            all_gpus_visible: false,
            gpus: (0..8)
                .map(|index| Gpu {
                    index,
                    uuid: format!("GPU-{m}-{index}"),
                    model: "NVIDIA H100 80GB HBM3".into(),
                    vendor: "nvidia".into(),
                    total: Bytes::gb(80),
                    held_outside: held_outside(index),
                    healthy: true,
                    mig: None,
                })
                .collect(),
        })
        .collect();
    Inventory::new(machines).expect("a consistent fleet")
}
