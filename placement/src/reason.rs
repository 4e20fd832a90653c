//! Why a worker waits: one reason per GPU (or machine) that could not take it, in the seed's words.

use crate::inventory::GpuRef;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Why one GPU or machine cannot take a worker now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PendingReason {
    /// Shared work already takes too much of the GPU for this worker to fit beside it.
    SharedFull {
        /// The GPU.
        gpu: GpuRef,
        /// What its sharers take.
        taken: Bytes,
        /// What it offers.
        offered: Bytes,
        /// What the worker needs.
        needs: Bytes,
    },
    /// Even empty, the GPU offers less than the worker needs.
    OffersTooLittle {
        /// The GPU.
        gpu: GpuRef,
        /// Its memory.
        total: Bytes,
        /// What is held outside Tessera.
        held_outside: Bytes,
        /// What the worker needs.
        needs: Bytes,
    },
    /// One worker holds the GPU whole.
    HeldWhole {
        /// The GPU.
        gpu: GpuRef,
        /// The worker holding it.
        by: String,
    },
    /// The worker wants a whole GPU and this one is shared.
    Shared {
        /// The GPU.
        gpu: GpuRef,
        /// How many workers share it.
        sharers: usize,
    },
    /// The GPU is of another vendor.
    WrongVendor {
        /// The GPU.
        gpu: GpuRef,
        /// Its vendor.
        vendor: String,
        /// The vendor asked for.
        wanted: String,
    },
    /// The GPU is of another model.
    WrongModel {
        /// The GPU.
        gpu: GpuRef,
        /// Its model.
        model: String,
        /// The models asked for.
        wanted: Vec<String>,
    },
    /// The GPU is unhealthy and the worker wants healthy GPUs only.
    Unhealthy {
        /// The GPU.
        gpu: GpuRef,
    },
    /// The machine has some GPUs that fit, but fewer than the worker asks for.
    TooFewGpus {
        /// The machine.
        machine: String,
        /// GPUs that fit.
        fit: u32,
        /// GPUs asked for.
        needs: u32,
    },
    /// The machine's free CPU cores are too few.
    TooFewCpuCores {
        /// The machine.
        machine: String,
        /// Cores free now.
        free: u32,
        /// All its cores.
        total: u32,
        /// Cores asked for.
        needs: u32,
    },
    /// The machine's free memory is too little.
    TooLittleMemory {
        /// The machine.
        machine: String,
        /// Memory free now.
        free: Bytes,
        /// All its memory.
        total: Bytes,
        /// Memory asked for.
        needs: Bytes,
    },
    /// No GPU in the fleet is of the vendor, model or ids asked for, or the fleet has none.
    NoGpuMatches,
    /// More GPUs or machines cannot take the worker than are listed: [`crate::schedule::REASONS_LISTED`]
    /// are, the nearest to fitting where that is known (one shared GPU: those with the most room).
    More,
    /// The GPU runs MPS and its server has all the clients it takes.
    MpsFull {
        /// The GPU.
        gpu: GpuRef,
    },
    /// The GPU runs MPS, whose clients each run on one GPU; the worker wants several.
    MpsOneGpu {
        /// The GPU.
        gpu: GpuRef,
    },
    /// The GPU is cut into MIG instances: work runs in those, not on it.
    CutIntoInstances {
        /// The GPU.
        gpu: GpuRef,
    },
    /// The GPU is a MIG instance, which one engine holds whole; the worker asks for a share.
    InstanceHeldWhole {
        /// The instance.
        gpu: GpuRef,
    },
    /// The GPU is a MIG instance, where an engine runs on it alone (CUDA sees one MIG device per process);
    /// the worker asks for several GPUs.
    InstanceAlone {
        /// The instance.
        gpu: GpuRef,
    },
}

impl PendingReason {
    /// Whether the request's own rules turn the GPU away (its vendor, models, health, a MIG role),
    /// whatever holds it: a GPU it could never use, not one it waits for.
    pub fn is_barred(&self) -> bool {
        use PendingReason::*;
        matches!(
            self,
            WrongVendor { .. }
                | WrongModel { .. }
                | Unhealthy { .. }
                | CutIntoInstances { .. }
                | InstanceHeldWhole { .. }
                | InstanceAlone { .. }
        )
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PendingReason::*;
        match self {
            SharedFull {
                gpu,
                taken,
                offered,
                needs,
            } => write!(
                f,
                "{gpu}: {} of {} GB taken by shared work; it needs {}",
                taken.gb_text(),
                offered.gb_text(),
                needs.gb_text()
            ),
            OffersTooLittle {
                gpu,
                total,
                held_outside,
                needs,
            } if *held_outside > Bytes::ZERO => write!(
                f,
                "{gpu} offers {} of its {} GB ({} GB held outside Tessera); it needs {}",
                total.saturating_sub(*held_outside).gb_text(),
                total.gb_text(),
                held_outside.gb_text(),
                needs.gb_text()
            ),
            OffersTooLittle {
                gpu, total, needs, ..
            } => {
                write!(
                    f,
                    "{gpu} offers all of its {} GB; it needs {}",
                    total.gb_text(),
                    needs.gb_text()
                )
            }
            HeldWhole { gpu, by } => write!(f, "{gpu} is held whole by {by}"),
            Shared { gpu, sharers } => {
                let s = if *sharers == 1 { "worker" } else { "workers" };
                write!(f, "{gpu} is shared by {sharers} {s}; it needs a whole GPU")
            }
            WrongVendor {
                gpu,
                vendor,
                wanted,
            } => write!(f, "{gpu} is made by {vendor}; it needs {wanted}"),
            WrongModel { gpu, model, wanted } => {
                write!(f, "{gpu} is a {model}; it needs {}", wanted.join(" or "))
            }
            Unhealthy { gpu } => write!(f, "{gpu} is unhealthy"),
            TooFewGpus {
                machine,
                fit,
                needs,
            } => {
                let s = if *fit == 1 { "GPU fits" } else { "GPUs fit" };
                write!(f, "{machine}: {fit} {s}; it needs {needs}")
            }
            TooFewCpuCores {
                machine,
                free,
                total,
                needs,
            } => {
                write!(
                    f,
                    "{machine} has {free} of its {total} CPU cores free; it needs {needs}"
                )
            }
            TooLittleMemory {
                machine,
                free,
                total,
                needs,
            } => write!(
                f,
                "{machine} has {} of its {} GB of memory free; it needs {}",
                free.gb_text(),
                total.gb_text(),
                needs.gb_text()
            ),
            NoGpuMatches => write!(f, "no GPU matches the vendor, models and ids asked for"),
            More => write!(f, "and more GPUs or machines that cannot take it"),
            MpsFull { gpu } => write!(
                f,
                "{gpu} runs MPS, whose server takes at most {} engines, and has that many",
                crate::sharing::MPS_MAX_CLIENTS
            ),
            MpsOneGpu { gpu } => write!(
                f,
                "{gpu} runs MPS, where each engine runs on that one GPU; it needs several"
            ),
            CutIntoInstances { gpu } => {
                write!(f, "{gpu} is cut into MIG instances: work runs in those")
            }
            InstanceHeldWhole { gpu } => {
                write!(f, "{gpu} takes one engine whole; it asks for a share")
            }
            InstanceAlone { gpu } => write!(
                f,
                "{gpu} runs its engine on it alone; it asks for several GPUs"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_reason_for_a_gpu_full_of_shared_work() {
        let r = PendingReason::SharedFull {
            gpu: GpuRef::new("majin", 0),
            taken: Bytes::from_gb(6.5).unwrap(),
            offered: Bytes::gb(7),
            needs: Bytes::from_gb(1.5).unwrap(),
        };
        assert_eq!(
            r.to_string(),
            "GPU 0 of majin: 6.5 of 7 GB taken by shared work; it needs 1.5"
        );
    }

    #[test]
    fn the_seed_reason_for_a_gpu_that_offers_too_little() {
        let r = PendingReason::OffersTooLittle {
            gpu: GpuRef::new("majin", 0),
            total: Bytes::gb(8),
            held_outside: Bytes::gb(1),
            needs: Bytes::from_gb(7.5).unwrap(),
        };
        assert_eq!(
            r.to_string(),
            "GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Tessera); it needs 7.5"
        );
        let none_outside = PendingReason::OffersTooLittle {
            gpu: GpuRef::new("majin", 0),
            total: Bytes::gb(8),
            held_outside: Bytes::ZERO,
            needs: Bytes::from_gb(7.5).unwrap(),
        };
        assert_eq!(
            none_outside.to_string(),
            "GPU 0 of majin offers all of its 8 GB; it needs 7.5"
        );
    }

    #[test]
    fn the_other_reasons_name_the_gpu_or_machine_and_the_need() {
        let gpu = GpuRef::new("majin", 0);
        let cases = [
            (
                PendingReason::HeldWhole {
                    gpu: gpu.clone(),
                    by: "trainer".into(),
                },
                "GPU 0 of majin is held whole by trainer",
            ),
            (
                PendingReason::Shared {
                    gpu: gpu.clone(),
                    sharers: 2,
                },
                "GPU 0 of majin is shared by 2 workers; it needs a whole GPU",
            ),
            (
                PendingReason::WrongVendor {
                    gpu: gpu.clone(),
                    vendor: "nvidia".into(),
                    wanted: "amd".into(),
                },
                "GPU 0 of majin is made by nvidia; it needs amd",
            ),
            (
                PendingReason::WrongModel {
                    gpu: gpu.clone(),
                    model: "RTX 4060".into(),
                    wanted: vec!["H200".into(), "A100".into()],
                },
                "GPU 0 of majin is a RTX 4060; it needs H200 or A100",
            ),
            (
                PendingReason::Unhealthy { gpu },
                "GPU 0 of majin is unhealthy",
            ),
            (
                PendingReason::TooFewGpus {
                    machine: "majin".into(),
                    fit: 1,
                    needs: 2,
                },
                "majin: 1 GPU fits; it needs 2",
            ),
            (
                PendingReason::TooFewCpuCores {
                    machine: "majin".into(),
                    free: 4,
                    total: 16,
                    needs: 8,
                },
                "majin has 4 of its 16 CPU cores free; it needs 8",
            ),
            (
                PendingReason::TooLittleMemory {
                    machine: "majin".into(),
                    free: Bytes::gb(12),
                    total: Bytes::gb(64),
                    needs: Bytes::gb(16),
                },
                "majin has 12 of its 64 GB of memory free; it needs 16",
            ),
        ];
        for (reason, text) in cases {
            assert_eq!(reason.to_string(), text);
        }
    }
}
