//! llama.cpp sized to a share. It has no memory-fraction flag: what it takes follows from the context it
//! is started with (`-c`), its slots and cache type, and how many layers it puts on the GPU (`-ngl`). So
//! Tessera chooses the context that fits the share, by the estimate, and where even a short context with
//! every layer does not fit, how many layers go on the GPU.

use super::memory::{estimate, Estimate, Settings, CONTEXT_PAD, DEFAULT_CONTEXT};
use super::model::ModelInfo;
use super::Gap;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The shortest context per slot Tessera starts an engine with: less serves no real prompt.
pub const MIN_CONTEXT: u32 = 2 * CONTEXT_PAD;

/// The context per slot an engine with layers left off the GPU gets: it is slow already, and every
/// layer on the GPU is worth more than a longer context.
pub const OFFLOAD_CONTEXT: u32 = DEFAULT_CONTEXT;

/// The context (all slots together) an engine gets where the estimate cannot choose one, having a gap:
/// long enough for real prompts, far short of the 128k and more that many models are trained for, which
/// llama.cpp would otherwise take (or, in recent builds, fit to what is free on the GPU: the neighbours'
/// room).
pub const CAUTIOUS_CONTEXT: u32 = 4096;

/// What Tessera starts llama.cpp with so that it fits its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fitted {
    /// Each slot's context in tokens.
    pub context: u32,
    /// Slots (`-np`).
    pub slots: u32,
    /// llama.cpp's `-c`: every slot's context together.
    pub ctx_size: u32,
    /// Layers on the GPU (`-ngl`), where not all of them fit; `None` puts every layer there.
    pub gpu_layers: Option<u32>,
    /// The model's layers.
    pub layers: u32,
    /// What the estimate says it takes on the GPU like this.
    pub needed: Bytes,
    /// What it would take with this context and every layer on the GPU.
    pub whole: Bytes,
    /// The share.
    pub share: Bytes,
    /// The model's own context, which llama.cpp would take without `-c`.
    pub own_context: u32,
    /// What the model's own context would take with every layer on the GPU.
    pub own_needed: Bytes,
}

/// Why no size fits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// The estimate has a gap, so no context can be chosen by it.
    #[error("the estimate is incomplete ({0}), so no context is chosen for it")]
    Incomplete(String),
    /// Not one layer fits with the shortest context.
    #[error(
        "not one of its layers fits its {} share with a context of {MIN_CONTEXT} tokens",
        .share.size_text()
    )]
    NoRoom {
        /// The share.
        share: Bytes,
    },
    /// What the settings take, by the estimate, is more than the share.
    #[error("{0}")]
    Over(Judged),
    /// The weights and buffers alone take the share, leaving no room for a KV cache.
    #[error(
        "its weights and buffers take {} by the estimate, which leaves no room for a KV cache in its {} \
         share",
        .fixed.size_text(),
        .share.size_text()
    )]
    NoCacheRoom {
        /// The weights, compute buffers and output together.
        fixed: Bytes,
        /// The share.
        share: Bytes,
    },
}

/// The most tokens the KV cache of an engine estimated as `e` may hold so that the engine stays within
/// `share`: what the share leaves after its weights, compute buffers and output, over the cache's bytes
/// per token. For an engine that sizes its cache by a fraction of what it finds free (SGLang), this bound
/// does not move with what its neighbours free meanwhile. `Ok(None)` where it keeps no cache.
pub fn cache_tokens_within(e: &Estimate, share: Bytes) -> Result<Option<u64>, Unfit> {
    let Some(kv) = e.kv_cache.filter(|kv| kv.bytes > Bytes::ZERO) else {
        return Ok(None);
    };
    let tokens = u64::from(e.assumed.ctx_size.max(1));
    let per_token = kv.bytes.get().div_ceil(tokens).max(1);
    let fixed = e.beside_cache();
    match share.get().saturating_sub(fixed.get()) / per_token {
        0 => Err(Unfit::NoCacheRoom { fixed, share }),
        n => Ok(Some(n)),
    }
}

/// Settings Tessera did not choose (a recipe's own context, or the cautious bound), and what the
/// estimate says they take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judged {
    /// llama.cpp's `-c`: every slot's context together.
    pub ctx_size: u32,
    /// Slots (`-np`).
    pub slots: u32,
    /// What the estimate says it takes: where it has a gap, the least it takes.
    pub needed: Bytes,
    /// The share.
    pub share: Bytes,
    /// The estimate's gap, where it has one that could be most of what it takes.
    pub gap: Option<String>,
}

impl fmt::Display for Judged {
    /// "context 4096 × 1 slot takes at least 1.2 GB by the estimate, over its 1 GB share".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "context {} × {} takes {}{} by the estimate",
            self.ctx_size,
            slots_text(self.slots),
            if self.gap.is_some() { "at least " } else { "" },
            self.needed.size_text()
        )?;
        if self.needed > self.share {
            write!(f, ", over its {} share", self.share.size_text())
        } else {
            write!(f, " of its {} share", self.share.size_text())
        }
    }
}

fn slots_text(n: u32) -> String {
    if n == 1 {
        "1 slot".to_owned()
    } else {
        format!("{n} slots")
    }
}

/// `base` as it is (its context included, `None` for the model's own), judged against `share`: refused
/// where the estimate, or the part of it that it knows, is more than the share.
pub fn judge(model: &ModelInfo, share: Bytes, base: &Settings) -> Result<Judged, Unfit> {
    let e = estimate(model, base);
    let judged = Judged {
        ctx_size: e.assumed.ctx_size,
        slots: e.assumed.slots,
        needed: e.total(),
        share,
        gap: e.gaps.iter().find(|g| blocks_fit(g)).map(Gap::to_string),
    };
    if judged.needed > share {
        Err(Unfit::Over(judged))
    } else {
        Ok(judged)
    }
}

/// `base` with [`CAUTIOUS_CONTEXT`] shared by its slots (or the model's own context, where shorter),
/// judged against `share`: for a model whose estimate has a gap.
pub fn cautious(model: &ModelInfo, share: Bytes, base: &Settings) -> Result<Judged, Unfit> {
    let total = CAUTIOUS_CONTEXT.min(model.context_length.unwrap_or(CAUTIOUS_CONTEXT).max(1));
    judge(
        model,
        share,
        &Settings {
            context: Some((total / base.slots.max(1)).max(1)),
            ..*base
        },
    )
}

/// The longest context per slot, a multiple of llama.cpp's padding up to the model's own, that fits
/// `share` under `base` (its slots, cache type and batches); where none from [`MIN_CONTEXT`] does, the
/// most layers that fit with [`OFFLOAD_CONTEXT`].
pub fn fit_share(model: &ModelInfo, share: Bytes, base: &Settings) -> Result<Fitted, Unfit> {
    let own_context = model.context_length.unwrap_or(DEFAULT_CONTEXT).max(1);
    let at = |context: u32| {
        estimate(
            model,
            &Settings {
                context: Some(context),
                ..*base
            },
        )
    };
    let own = at(own_context);
    if let Some(gap) = own.gaps.iter().find(|g| blocks_fit(g)) {
        return Err(Unfit::Incomplete(gap.to_string()));
    }
    let fitted = |e: &Estimate, gpu_layers: Option<u32>, needed: Bytes| Fitted {
        context: e.assumed.context,
        slots: e.assumed.slots,
        ctx_size: e.assumed.ctx_size,
        gpu_layers,
        layers: e.weights.per_layer.len() as u32,
        needed,
        whole: e.total(),
        share,
        own_context,
        own_needed: own.total(),
    };
    if own.total() <= share {
        return Ok(fitted(&own, None, own.total()));
    }
    // The estimate grows with the context (a property test holds it to that): the longest that fits is
    // found by halving, over whole paddings.
    let shortest = MIN_CONTEXT.min(own_context);
    let first = at(shortest);
    if first.total() <= share {
        let (mut fits, mut over) = (shortest / CONTEXT_PAD, own_context / CONTEXT_PAD + 1);
        let mut best = first;
        while over - fits > 1 {
            let mid = fits + (over - fits) / 2;
            let e = at(mid * CONTEXT_PAD);
            if e.total() <= share {
                (fits, best) = (mid, e);
            } else {
                over = mid;
            }
        }
        return Ok(fitted(&best, None, best.total()));
    }
    let e = at(OFFLOAD_CONTEXT.min(own_context));
    let layers = e.weights.per_layer.len() as u32;
    (1..layers)
        .rev()
        .map(|n| (n, on_gpu(&e, n)))
        .find(|&(_, needed)| needed <= share)
        .map(|(n, needed)| fitted(&e, Some(n), needed))
        .ok_or(Unfit::NoRoom { share })
}

/// What `estimate` takes on the GPU with its last `n` layers there, as llama.cpp offloads them: those
/// layers' weights, KV cache and recurrent state, and (counted whole, an upper bound) the compute and output
/// buffers.
/// The embeddings and the output head stay on the CPU until every layer is on the GPU.
fn on_gpu(estimate: &Estimate, n: u32) -> Bytes {
    let layers = &estimate.weights.per_layer;
    let weights: Bytes = layers[layers.len().saturating_sub(n as usize)..]
        .iter()
        .copied()
        .sum();
    let share = |bytes: Bytes| Bytes(bytes.get() / layers.len().max(1) as u64 * u64::from(n));
    let kv = estimate.kv_cache.map_or(Bytes::ZERO, |kv| share(kv.bytes));
    let recurrent = estimate.recurrent.map_or(Bytes::ZERO, |r| share(r.bytes));
    weights
        + kv
        + recurrent
        + estimate.compute.map_or(Bytes::ZERO, |c| c.bytes)
        + estimate.output.unwrap_or(Bytes::ZERO)
}

impl fmt::Display for Fitted {
    /// What was chosen and why, for the Models tab.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slots = slots_text(self.slots);
        match self.gpu_layers {
            Some(n) => write!(
                f,
                "{n} of {} layers on the GPU, context {} × {slots}: every layer would take {} of its {} share",
                self.layers,
                self.context,
                self.whole.size_text(),
                self.share.size_text()
            ),
            None if self.context == self.own_context => write!(
                f,
                "context {} (the model's own) × {slots}: {} of its {} share",
                self.context,
                self.needed.size_text(),
                self.share.size_text()
            ),
            None => write!(
                f,
                "context {} × {slots}, the longest that fits its {} share ({}); the model's own {} would take {}",
                self.context,
                self.share.size_text(),
                self.needed.size_text(),
                self.own_context,
                self.own_needed.size_text()
            ),
        }
    }
}

/// Whether a gap keeps the estimate from sizing an engine: every gap but the output buffer's (a few MB)
/// leaves out a part that could be most of it.
fn blocks_fit(gap: &Gap) -> bool {
    !matches!(gap, Gap::NoVocabulary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::gguf::GgufHeader;
    use crate::estimate::writer::{llama, V};
    use proptest::prelude::*;

    /// 8 layers, 1024 wide, f16, a context of 32,768: 2 GB of weights... in miniature.
    fn model(context: u32) -> ModelInfo {
        let g = llama(8, 1024, 2816, 16, 4, 32_000, 1).kv("llama.context_length", V::U32(context));
        ModelInfo::from_header(&GgufHeader::parse(&g.header()).unwrap(), None)
    }

    fn total(m: &ModelInfo, context: u32) -> Bytes {
        estimate(
            m,
            &Settings {
                context: Some(context),
                ..Settings::default()
            },
        )
        .total()
    }

    #[test]
    fn a_share_that_holds_the_models_own_context_gets_it() {
        let m = model(4096);
        let share = Bytes::gb(4);
        let fit = fit_share(&m, share, &Settings::default()).unwrap();
        assert_eq!(
            (fit.context, fit.slots, fit.ctx_size, fit.gpu_layers),
            (4096, 1, 4096, None)
        );
        assert_eq!(fit.needed, total(&m, 4096));
        assert!(
            fit.to_string()
                .starts_with("context 4096 (the model's own) × 1 slot: "),
            "{fit}"
        );
    }

    #[test]
    fn a_share_too_small_for_the_models_own_context_gets_the_longest_that_fits() {
        let m = model(131_072);
        let share = total(&m, 20_000);
        let fit = fit_share(&m, share, &Settings::default()).unwrap();
        assert!(fit.needed <= share);
        assert_eq!(fit.context % CONTEXT_PAD, 0);
        assert!(total(&m, fit.context + CONTEXT_PAD) > share, "the longest");
        // 20,000 tokens take a padded 20,224 cells, so that is what fits.
        assert_eq!(fit.context, 20_224);
        assert!(
            fit.to_string().contains(", the longest that fits its"),
            "{fit}"
        );
    }

    #[test]
    fn slots_share_the_share_and_their_context_is_each_ones() {
        let m = model(131_072);
        let share = total(&m, 20_000);
        let base = Settings {
            slots: 4,
            ..Settings::default()
        };
        let fit = fit_share(&m, share, &base).unwrap();
        assert_eq!((fit.slots, fit.ctx_size), (4, fit.context * 4));
        assert!(fit.context < 20_000 / 3, "{}", fit.context);
    }

    #[test]
    fn a_share_that_cannot_hold_every_layer_gets_the_most_layers_that_fit() {
        let m = model(4096);
        let weights = m.weights.bytes;
        let fit = fit_share(&m, Bytes(weights.get() / 2), &Settings::default()).unwrap();
        let n = fit.gpu_layers.unwrap();
        assert!((1..8).contains(&n), "{n}");
        assert!(fit.needed <= fit.share);
        let e = estimate(
            &m,
            &Settings {
                context: Some(4096),
                ..Settings::default()
            },
        );
        assert!(on_gpu(&e, n + 1) > fit.share, "the most");
        assert!(
            fit.to_string().starts_with(&format!(
                "{n} of 8 layers on the GPU, context 4096 × 1 slot"
            )),
            "{fit}"
        );
        assert_eq!(
            fit_share(&m, Bytes::gb(0), &Settings::default()),
            Err(Unfit::NoRoom { share: Bytes::ZERO })
        );
    }

    #[test]
    fn a_model_with_a_gap_in_its_estimate_is_not_sized() {
        // No block count: no KV cache or compute buffers to size a context by.
        let g = crate::estimate::writer::Gguf::new("llama")
            .kv("llama.embedding_length", V::U32(64))
            .tensor("token_embd.weight", &[64, 300], 1);
        let m = ModelInfo::from_header(&GgufHeader::parse(&g.header()).unwrap(), None);
        let err = fit_share(&m, Bytes::gb(4), &Settings::default()).unwrap_err();
        assert!(matches!(err, Unfit::Incomplete(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains("metadata key llama.block_count is missing"),
            "{err}"
        );
    }

    #[test]
    fn a_recipe_s_own_context_is_judged_by_what_it_takes_and_refused_with_the_figures_over_the_share(
    ) {
        let m = model(131_072);
        let given = |ctx_size: u32, slots: u32| Settings {
            context: Some(ctx_size / slots),
            slots,
            ..Settings::default()
        };
        let share = total(&m, 16_384);
        let fits = judge(&m, share, &given(8192, 2)).unwrap();
        assert_eq!(
            (fits.ctx_size, fits.slots, fits.gap.as_deref()),
            (8192, 2, None)
        );
        assert!(fits.needed <= share);
        assert!(
            fits.to_string()
                .starts_with("context 8192 × 2 slots takes ")
                && fits.to_string().contains(" by the estimate of its "),
            "{fits}"
        );
        // The model's own context, as -c 0 asks.
        let Err(Unfit::Over(over)) = judge(&m, share, &Settings::default()) else {
            panic!("131,072 tokens do not fit a share that holds 16,384");
        };
        assert_eq!((over.ctx_size, over.needed), (131_072, total(&m, 131_072)));
        assert_eq!(
            Unfit::Over(over.clone()).to_string(),
            format!(
                "context 131072 × 1 slot takes {} by the estimate, over its {} share",
                over.needed.size_text(),
                share.size_text()
            )
        );
    }

    /// A model without attention: its weights, recurrent state and output are known, its compute buffers
    /// are not.
    fn mamba(context: u32) -> ModelInfo {
        let g = crate::estimate::writer::Gguf::new("mamba")
            .kv("mamba.context_length", V::U32(context))
            .kv("mamba.block_count", V::U32(2))
            .kv("mamba.embedding_length", V::U32(1024))
            .kv("mamba.ssm.conv_kernel", V::U32(4))
            .kv("mamba.ssm.inner_size", V::U32(2048))
            .kv("mamba.ssm.state_size", V::U32(16))
            .tensor("token_embd.weight", &[1024, 32_000], 1)
            .tensor("blk.0.ssm_in.weight", &[1024, 4096], 1)
            .tensor("blk.1.ssm_in.weight", &[1024, 4096], 1);
        ModelInfo::from_header(&GgufHeader::parse(&g.header()).unwrap(), None)
    }

    #[test]
    fn a_model_whose_estimate_has_a_gap_gets_a_cautious_context_judged_by_the_least_it_takes() {
        let m = mamba(1_048_576);
        assert!(matches!(
            fit_share(&m, Bytes::gb(4), &Settings::default()),
            Err(Unfit::Incomplete(_))
        ));
        let bound = cautious(&m, Bytes::gb(4), &Settings::default()).unwrap();
        assert_eq!((bound.ctx_size, bound.slots), (CAUTIOUS_CONTEXT, 1));
        assert!(bound
            .gap
            .as_deref()
            .unwrap()
            .contains("its compute buffers are not estimated"));
        assert!(bound.to_string().contains(" takes at least "), "{bound}");
        // The least it takes: all that is known, its recurrent state among it.
        let known = estimate(
            &m,
            &Settings {
                context: Some(CAUTIOUS_CONTEXT),
                ..Settings::default()
            },
        );
        assert!(known.recurrent.unwrap().bytes > Bytes::ZERO);
        assert_eq!(bound.needed, known.total());
        // Slots share the bound; they do not multiply it.
        let four = Settings {
            slots: 4,
            ..Settings::default()
        };
        let bound = cautious(&m, Bytes::gb(4), &four).unwrap();
        assert_eq!((bound.ctx_size, bound.slots), (CAUTIOUS_CONTEXT, 4));
        // Its weights alone are more than a 10 MB share: refused, not started to find out.
        let tiny = Bytes(10_000_000);
        let Err(Unfit::Over(over)) = cautious(&m, tiny, &Settings::default()) else {
            panic!("the weights alone are over the share");
        };
        assert!(over.needed >= m.weights.bytes);
        assert!(
            Unfit::Over(over)
                .to_string()
                .ends_with(&format!(", over its {} share", tiny.size_text())),
            "the figures"
        );
        // A model trained for less than the bound keeps its own.
        assert_eq!(
            cautious(&mamba(2048), Bytes::gb(4), &Settings::default())
                .unwrap()
                .ctx_size,
            2048
        );
    }

    #[test]
    fn a_hybrid_is_sized_by_its_state_for_its_slots_beside_its_attention_layers_cache() {
        // Llama's shape with Granite 4.0 H's architecture: half the layers Mamba-2 mixers.
        let mut g = llama(8, 1024, 2816, 16, 4, 32_000, 1)
            .kv("llama.context_length", V::U32(131_072))
            .kv("llama.ssm.conv_kernel", V::U32(4))
            .kv("llama.ssm.inner_size", V::U32(2048))
            .kv("llama.ssm.state_size", V::U32(128))
            .kv("llama.ssm.group_count", V::U32(1))
            .kv(
                "llama.attention.head_count_kv",
                V::U32s(vec![0, 4, 0, 4, 0, 4, 0, 4]),
            );
        for (key, value) in &mut g.kv {
            *key = key.replace("llama.", "granitehybrid.");
            if key == "general.architecture" {
                *value = V::Str("granitehybrid");
            }
        }
        let m = ModelInfo::from_header(&GgufHeader::parse(&g.header()).unwrap(), None);
        let share = total(&m, 20_000);
        let fit = fit_share(&m, share, &Settings::default()).unwrap();
        assert!(fit.needed <= share && total(&m, fit.context + CONTEXT_PAD) > share);
        let e = |slots: u32| {
            estimate(
                &m,
                &Settings {
                    context: Some(fit.context),
                    slots,
                    ..Settings::default()
                },
            )
        };
        // 4 layers of (3 × (2048 + 2 × 128) + 128 × 2048) f32 per slot.
        let state = Bytes(4 * (3 * 2304 + 128 * 2048) * 4);
        assert_eq!(e(1).recurrent.unwrap().bytes, state);
        assert_eq!(e(1).total(), fit.needed);
        assert_eq!(e(3).recurrent.unwrap().bytes, Bytes(3 * state.get()));
    }

    proptest! {
        /// Against the estimate itself: what is chosen fits, and a padding more would not (or it is the
        /// model's own).
        #[test]
        fn the_chosen_context_fits_and_is_the_longest_that_does(share_mb in 200u64..3_000) {
            let m = model(65_536);
            let share = Bytes(share_mb << 20);
            if let Ok(fit) = fit_share(&m, share, &Settings::default()) {
                prop_assert!(fit.needed <= share);
                if fit.gpu_layers.is_none() && fit.context < 65_536 {
                    prop_assert!(total(&m, fit.context + CONTEXT_PAD) > share);
                }
            }
        }
    }
}
