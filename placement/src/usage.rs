//! Usage accounting (seed 000): a shared GPU counts for each sharer by its share of the GPU's memory.
//!
//! A worker taking 2 GB of an 8 GB GPU for an hour is a quarter of a GPU-hour, with a quarter of the GPU's use
//! and energy. A whole GPU counts as one per GPU.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// Milliseconds in an hour.
const HOUR_MS: u64 = 3_600_000;

/// GPU time in GPU-milliseconds: one GPU for one millisecond is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuMillis(pub u64);

impl GpuMillis {
    /// GPU-hours with up to three decimals, trailing zeros dropped: `0.25`, `1`.
    pub fn hours_text(self) -> String {
        let thousandths =
            (u128::from(self.0) * 1000 + u128::from(HOUR_MS) / 2) / u128::from(HOUR_MS);
        let (whole, frac) = (thousandths / 1000, thousandths % 1000);
        if frac == 0 {
            whole.to_string()
        } else {
            format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0'))
        }
    }
}

/// A span of time a worker held memory on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    /// When it began, milliseconds since the epoch.
    pub start_ms: u64,
    /// When it ended.
    pub end_ms: u64,
    /// Memory held: the share for shared work, the GPU's total for a whole GPU.
    pub held: Bytes,
    /// The GPU's total memory.
    pub gpu_total: Bytes,
}

impl Holding {
    /// This holding's part of a GPU-wide figure (energy in millijoules, utilisation-milliseconds), rounded
    /// down: the figure times held over total.
    pub fn part_of(&self, figure: u64) -> u64 {
        if self.gpu_total == Bytes::ZERO {
            return 0;
        }
        let held = self.held.min(self.gpu_total);
        (u128::from(figure) * u128::from(held.get()) / u128::from(self.gpu_total.get())) as u64
    }

    /// GPU time: duration times held over total.
    pub fn gpu_time(&self) -> GpuMillis {
        GpuMillis(self.part_of(self.end_ms.saturating_sub(self.start_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_gb_of_an_eight_gb_gpu_for_an_hour_is_a_quarter_gpu_hour() {
        let h = Holding {
            start_ms: 0,
            end_ms: HOUR_MS,
            held: Bytes::gb(2),
            gpu_total: Bytes::gb(8),
        };
        assert_eq!(h.gpu_time(), GpuMillis(HOUR_MS / 4));
        assert_eq!(h.gpu_time().hours_text(), "0.25");
        // and a quarter of the energy and use
        assert_eq!(h.part_of(1_000_000), 250_000);
    }

    #[test]
    fn a_whole_gpu_counts_as_one() {
        let h = Holding {
            start_ms: 0,
            end_ms: 2 * HOUR_MS,
            held: Bytes::gb(96),
            gpu_total: Bytes::gb(96),
        };
        assert_eq!(h.gpu_time().hours_text(), "2");
    }

    #[test]
    fn a_share_change_halfway_is_two_holdings() {
        let first = Holding {
            start_ms: 0,
            end_ms: HOUR_MS / 2,
            held: Bytes::gb(2),
            gpu_total: Bytes::gb(8),
        };
        let second = Holding {
            start_ms: HOUR_MS / 2,
            end_ms: HOUR_MS,
            held: Bytes::gb(4),
            gpu_total: Bytes::gb(8),
        };
        let total = GpuMillis(first.gpu_time().0 + second.gpu_time().0);
        assert_eq!(total.hours_text(), "0.375");
    }
}
