//! The right share from what ran (issue 32): a model's peak measured memory against the share it had, the
//! line the Models tab shows for it, and the smaller share that would still hold that peak with a margin.
//!
//! Also the share that holds a number of bytes, rounded up to a whole percent, which the estimate's
//! Suggest uses too: both sides need it, so it lives here once.

use crate::units::{BasisPoints, Bytes};
use serde::{Deserialize, Serialize};

/// Room kept above the peak a smaller share is offered for: a fifth of the peak, for the requests not yet
/// seen (longer prompts, more of them at once) and an allocator's slack.
pub const MARGIN: BasisPoints = BasisPoints::percent(20);

/// How long a model must have run on a share before a smaller one is offered: a peak seen over less is a
/// quiet hour, not a workload.
pub const MIN_OBSERVED_MS: u64 = 24 * 3_600_000;

/// A peak this close to its share (or closer) is worth a look: the share may be too small.
pub const CLOSE: BasisPoints = BasisPoints::percent(95);

/// The share that holds `needed` on a GPU of `gpu_total`, rounded up to a whole percent; `None` when one
/// GPU cannot hold it.
pub fn share_for(needed: Bytes, gpu_total: Bytes) -> Option<BasisPoints> {
    if gpu_total == Bytes::ZERO {
        return None;
    }
    let percent = (u128::from(needed.get()) * 100).div_ceil(u128::from(gpu_total.get()));
    u32::try_from(percent)
        .ok()
        .filter(|&p| p <= 100)
        .map(|p| BasisPoints::percent(p.max(1)))
}

/// The warning, in a line of its own, when `share` of a GPU of `gpu_total` is below the estimated `needed`.
pub fn below_estimate(share: BasisPoints, gpu_total: Bytes, needed: Bytes) -> Option<String> {
    let held = gpu_total.share(share);
    (held < needed).then(|| {
        format!(
            "The share ({} GB) is below the estimated {} GB this model needs with these settings.",
            held.gb_text(),
            needed.gb_text()
        )
    })
}

/// How a model's engines filled their share, measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peak {
    /// The most any of its engines was measured to hold on one GPU.
    pub peak: Bytes,
    /// The share it held there.
    pub share: Bytes,
    /// That GPU's memory.
    pub gpu_total: Bytes,
    /// How long it has run on this share, measured, in milliseconds: from its first reading to its last.
    pub observed_ms: u64,
    /// Whether its engine fills whatever share it gets (vLLM's and SGLang's KV cache), so that its peak
    /// is its share and says nothing of what it needs.
    pub fills_share: bool,
}

/// What the peak says of the share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Fit {
    /// Its engine fills its share: the peak says nothing.
    FillsShare,
    /// The peak went past the share: a promise broken.
    Past,
    /// The peak came within [`CLOSE`] of the share.
    Close,
    /// A smaller share holds the peak with [`MARGIN`] to spare.
    Smaller {
        /// That share, a whole percent.
        share: BasisPoints,
    },
    /// The share fits, or it has not run long enough to tell.
    Fits,
}

impl Peak {
    /// What the peak says of the share.
    pub fn fit(&self) -> Fit {
        // Past its share is a promise broken by any engine, one that fills what it gets too (vLLM's
        // fraction is of the whole GPU, SGLang's of what it found free).
        if self.peak > self.share {
            return Fit::Past;
        }
        if self.fills_share {
            return Fit::FillsShare;
        }
        if self.peak >= self.share.share(CLOSE) {
            return Fit::Close;
        }
        if self.observed_ms < MIN_OBSERVED_MS {
            return Fit::Fits;
        }
        let wanted = self.peak + self.peak.share(MARGIN);
        match share_for(wanted, self.gpu_total) {
            Some(smaller) if self.gpu_total.share(smaller) < self.share => {
                Fit::Smaller { share: smaller }
            }
            _ => Fit::Fits,
        }
    }

    /// The Models tab's line: `peak 4.1 GB of its 10 GB share over 3 days`, and what that says.
    pub fn line(&self) -> String {
        let head = format!(
            "peak {} of its {} share over {}",
            self.peak.size_text(),
            self.share.size_text(),
            span_text(self.observed_ms)
        );
        match self.fit() {
            Fit::FillsShare => format!(
                "{head}: its engine fills whatever share it gets with KV cache, so the peak does not say what it needs"
            ),
            Fit::Past => format!(
                "{head}: past its share, so its neighbours may run out of memory"
            ),
            Fit::Close => format!(
                "{head}: within {} % of its share, which may be too small",
                100 - CLOSE.get() / 100
            ),
            Fit::Smaller { share } => format!(
                "{head}: {} % ({}) would hold it with {} % to spare",
                share.percent_text(),
                self.gpu_total.share(share).size_text(),
                MARGIN.percent_text()
            ),
            Fit::Fits => head,
        }
    }
}

/// A span as a person says it, rounded down: `40 seconds`, `12 minutes`, `5 hours`, `3 days`.
pub fn span_text(ms: u64) -> String {
    let s = ms / 1000;
    let (n, unit) = match s {
        0..60 => (s, "second"),
        60..3_600 => (s / 60, "minute"),
        3_600..86_400 => (s / 3_600, "hour"),
        _ => (s / 86_400, "day"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DAY: u64 = 86_400_000;

    fn peak(peak_gb: f64, share_gb: u64, days: u64) -> Peak {
        Peak {
            peak: Bytes::from_gb(peak_gb).unwrap(),
            share: Bytes::gb(share_gb),
            gpu_total: Bytes::gb(80),
            observed_ms: days * DAY,
            fills_share: false,
        }
    }

    #[test]
    fn a_share_for_some_bytes_rounds_up_to_a_whole_percent() {
        let gpu = Bytes::gb(80);
        assert_eq!(share_for(Bytes::gb(8), gpu), Some(BasisPoints::percent(10)));
        assert_eq!(
            share_for(Bytes(Bytes::gb(8).get() + 1), gpu),
            Some(BasisPoints::percent(11))
        );
        assert_eq!(share_for(Bytes(1), gpu), Some(BasisPoints::percent(1)));
        assert_eq!(share_for(Bytes::gb(81), gpu), None);
        assert_eq!(share_for(Bytes::gb(1), Bytes::ZERO), None);
    }

    #[test]
    fn a_share_below_the_estimate_is_a_warning_in_the_words_of_the_form() {
        let gpu = Bytes::gb(80);
        assert_eq!(
            below_estimate(BasisPoints::percent(5), gpu, Bytes::gb(6)).as_deref(),
            Some("The share (4 GB) is below the estimated 6 GB this model needs with these settings.")
        );
        assert_eq!(
            below_estimate(BasisPoints::percent(10), gpu, Bytes::gb(6)),
            None
        );
    }

    #[test]
    fn a_model_that_used_far_less_than_its_share_for_days_is_offered_a_smaller_one_with_a_fifth_to_spare(
    ) {
        let p = peak(4.1, 10, 3);
        // 4.1 GB and a fifth is 4.92 GB: 7 % of 80 GB (5.6 GB) holds it.
        assert_eq!(
            p.fit(),
            Fit::Smaller {
                share: BasisPoints::percent(7)
            }
        );
        assert_eq!(
            p.line(),
            "peak 4.1 GB of its 10 GB share over 3 days: 7 % (5.6 GB) would hold it with 20 % to spare"
        );
    }

    #[test]
    fn a_peak_seen_over_less_than_a_day_offers_no_smaller_share() {
        let p = Peak {
            observed_ms: 5 * 3_600_000,
            ..peak(4.1, 10, 0)
        };
        assert_eq!(p.fit(), Fit::Fits);
        assert_eq!(p.line(), "peak 4.1 GB of its 10 GB share over 5 hours");
    }

    #[test]
    fn a_peak_near_or_past_the_share_says_so_at_once() {
        let close = Peak {
            observed_ms: 60_000,
            ..peak(9.6, 10, 0)
        };
        assert_eq!(close.fit(), Fit::Close);
        assert_eq!(
            close.line(),
            "peak 9.6 GB of its 10 GB share over 1 minute: within 5 % of its share, which may be too small"
        );
        let past = peak(10.5, 10, 2);
        assert_eq!(past.fit(), Fit::Past);
        assert!(past
            .line()
            .ends_with(": past its share, so its neighbours may run out of memory"));
    }

    #[test]
    fn an_engine_that_fills_its_share_is_offered_nothing_and_told_why() {
        let p = Peak {
            fills_share: true,
            ..peak(10.0, 10, 3)
        };
        assert_eq!(p.fit(), Fit::FillsShare);
        assert!(p.line().contains("fills whatever share it gets"));
    }

    #[test]
    fn an_engine_that_fills_its_share_and_went_past_it_is_said_to_be_past_it() {
        let p = Peak {
            fills_share: true,
            ..peak(10.5, 10, 3)
        };
        assert_eq!(p.fit(), Fit::Past);
        assert!(p
            .line()
            .ends_with(": past its share, so its neighbours may run out of memory"));
    }

    #[test]
    fn spans_read_as_a_person_says_them() {
        assert_eq!(span_text(999), "0 seconds");
        assert_eq!(span_text(1_000), "1 second");
        assert_eq!(span_text(59_999), "59 seconds");
        assert_eq!(span_text(60_000), "1 minute");
        assert_eq!(span_text(7_200_000), "2 hours");
        assert_eq!(span_text(DAY), "1 day");
        assert_eq!(span_text(3 * DAY + 1), "3 days");
    }

    proptest! {
        /// Against the plain statement of the rule: a smaller share offered always holds the peak and its
        /// margin, and is smaller than the share it replaces.
        #[test]
        fn a_smaller_share_offered_holds_the_peak_and_its_margin_and_is_smaller(
            peak_mb in 1u64..80_000,
            share_mb in 1u64..80_000,
        ) {
            let p = Peak {
                peak: Bytes(peak_mb << 20),
                share: Bytes(share_mb << 20),
                gpu_total: Bytes::gb(80),
                observed_ms: 2 * DAY,
                fills_share: false,
            };
            if let Fit::Smaller { share } = p.fit() {
                let held = p.gpu_total.share(share);
                prop_assert!(held >= p.peak + p.peak.share(MARGIN));
                prop_assert!(held < p.share);
                prop_assert_eq!(share.get() % 100, 0);
            }
        }
    }
}
