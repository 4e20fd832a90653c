//! The estimate: weights, KV cache, recurrent state, compute buffers and output buffer for a chosen context,
//! slots and cache type, each with what it assumed. Its own room because this is where llama.cpp's sizing rules
//! live (src/llama-context.cpp, src/llama-kv-cache*.cpp, src/llama-memory-recurrent.cpp) and where the compute
//! buffers' measured model is kept.

use super::ggml_type::GgmlType;
use super::model::{CacheKind, ModelInfo, ModelKind, RecurrentShape, Shape};
use super::weights::Weights;
use super::{Caveat, Gap};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// llama.cpp pads the context, each slot's context and the sliding-window cache to this many cells.
pub const CONTEXT_PAD: u32 = 256;

/// The context assumed for a file that states none.
pub const DEFAULT_CONTEXT: u32 = 4096;

/// Bytes per token of the compute buffer's small inputs (token ids, positions, output ids), measured: the
/// constant left over across every shape `scripts/bench-estimate` runs.
const INPUT_BYTES_PER_TOKEN: u64 = 24;

/// Bytes per token of each KV cache's cell indices: where the batch's keys and values go, i64 each.
const CACHE_INDEX_BYTES_PER_TOKEN: u64 = 16;

/// Bytes of one mask cell: llama.cpp's attention mask is f16.
const MASK_CELL: u64 = 2;

/// Bytes of one activation: f32.
const ACTIVATION: u64 = 4;

/// Bytes of one element of a recurrent state: llama.cpp keeps both parts in f32.
const STATE_ELEMENT: u64 = 4;

/// The KV cache types llama.cpp's `--cache-type-k` and `--cache-type-v` take (common/arg.cpp), the
/// default first.
pub const CACHE_TYPES: [GgmlType; 9] = [
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Iq4Nl,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Bf16,
    GgmlType::F32,
];

/// A KV cache type by the name llama.cpp takes (`f16`, `q8_0`), when llama.cpp takes it for a cache.
pub fn cache_type(name: &str) -> Option<GgmlType> {
    GgmlType::from_name(name).filter(|t| CACHE_TYPES.contains(t))
}

/// The serving choices an estimate is for: what llama.cpp's flags would say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// The context each slot may use, in tokens; `None` (or 0) for the model's own context length, as
    /// llama.cpp does. llama.cpp's `-c` is the total: this times `slots` ([`Assumed::ctx_size`]).
    pub context: Option<u32>,
    /// Requests served at once (`-np`); at least 1.
    pub slots: u32,
    /// KV cache type of the keys (`-ctk`).
    pub cache_type_k: GgmlType,
    /// KV cache type of the values (`-ctv`).
    pub cache_type_v: GgmlType,
    /// One KV pool shared by all slots (`--kv-unified`) instead of one per slot.
    pub unified_kv: bool,
    /// Logical batch (`-b`).
    pub batch: u32,
    /// Physical batch (`-ub`): the tokens one graph computes at once.
    pub ubatch: u32,
    /// A full-context cache for sliding-window layers too (`--swa-full`).
    pub swa_full: bool,
}

impl Default for Settings {
    /// llama.cpp server's defaults, one slot.
    fn default() -> Settings {
        Settings {
            context: None,
            slots: 1,
            cache_type_k: GgmlType::F16,
            cache_type_v: GgmlType::F16,
            unified_kv: false,
            batch: 2048,
            ubatch: 512,
            swa_full: false,
        }
    }
}

/// The most slots a person may ask an estimate for: llama.cpp takes more, but no GPU holds their caches.
pub const MAX_SLOTS: u32 = 1024;

/// Why chosen settings cannot be estimated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// Slots of 0 or more than [`MAX_SLOTS`].
    #[error("slots must be from 1 to {MAX_SLOTS}, not {0}")]
    Slots(u32),
    /// A cache type llama.cpp does not take.
    #[error("cache type {0:?} is not one llama.cpp takes (f16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, bf16, f32)")]
    CacheType(String),
}

impl Settings {
    /// llama.cpp server's defaults with what a person chooses: each slot's context (`None` for the
    /// model's own), the slots, and one cache type for keys and values.
    pub fn chosen(
        context: Option<u32>,
        slots: u32,
        cache: &str,
    ) -> Result<Settings, SettingsError> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(SettingsError::Slots(slots));
        }
        let cache = cache_type(cache).ok_or_else(|| SettingsError::CacheType(cache.to_owned()))?;
        Ok(Settings {
            context: context.filter(|&c| c > 0),
            slots,
            cache_type_k: cache,
            cache_type_v: cache,
            ..Settings::default()
        })
    }
}

/// The inputs an estimate assumed, resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assumed {
    /// Each slot's context in tokens.
    pub context: u32,
    /// True when `context` is the model's own, none having been chosen.
    pub context_from_model: bool,
    /// Slots.
    pub slots: u32,
    /// llama.cpp's `-c` for this: every slot's context together.
    pub ctx_size: u32,
    /// KV cache type of the keys.
    pub cache_type_k: GgmlType,
    /// KV cache type of the values.
    pub cache_type_v: GgmlType,
    /// One KV pool shared by all slots.
    pub unified_kv: bool,
    /// Tokens one graph computes at once: the physical batch, no more than the context.
    pub batch_tokens: u32,
}

/// The KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCache {
    /// All of it.
    pub bytes: Bytes,
    /// Cells (tokens) per stream in full-context layers, padded as llama.cpp pads them.
    pub cells: u32,
    /// Streams: one per slot, or one shared.
    pub streams: u32,
    /// Layers with a full-context cache.
    pub layers: u32,
    /// Layers with a sliding-window cache.
    pub swa_layers: u32,
    /// Cells per stream in sliding-window layers.
    pub swa_cells: u32,
    /// What the sliding-window layers take of `bytes`.
    pub swa_bytes: Bytes,
}

impl KvCache {
    /// No cache at all: an encoder's, which computes each input whole.
    pub const NONE: KvCache = KvCache {
        bytes: Bytes::ZERO,
        cells: 0,
        streams: 0,
        layers: 0,
        swa_layers: 0,
        swa_cells: 0,
        swa_bytes: Bytes::ZERO,
    };
}

/// The recurrent state (`llama_memory_recurrent`): one cell per slot, whatever the context, each holding every
/// recurrent layer's rolling part (`R`) and state proper (`S`), f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecurrentState {
    /// All of it.
    pub bytes: Bytes,
    /// Cells: one per slot (llama.cpp's `max(1, n_seq_max)`, `n_seq_max` being the server's `-np`).
    pub cells: u32,
    /// Layers that keep one.
    pub layers: u32,
    /// The rolling parts: the convolutions' last inputs or the token shifts.
    pub r_bytes: Bytes,
    /// The states proper: the SSMs' or the WKVs'.
    pub s_bytes: Bytes,
}

impl RecurrentState {
    /// `shape`'s state for `slots` sequences. llama.cpp keeps `1 + n_rs_seq` rows per cell, `n_rs_seq` being
    /// the rollback snapshots that a multi-token-prediction or other draft model asks for; the server asks
    /// for none without one, so one row.
    fn sized(shape: &RecurrentShape, slots: u32) -> RecurrentState {
        let cells = slots.max(1);
        let rows = u64::from(cells) * u64::from(shape.layers);
        let r_bytes = Bytes(
            shape
                .r_width
                .saturating_mul(rows)
                .saturating_mul(STATE_ELEMENT),
        );
        let s_bytes = Bytes(
            shape
                .s_width
                .saturating_mul(rows)
                .saturating_mul(STATE_ELEMENT),
        );
        RecurrentState {
            bytes: r_bytes + s_bytes,
            cells,
            layers: shape.layers,
            r_bytes,
            s_bytes,
        }
    }
}

/// The compute buffer: the activations of the largest graph, which llama.cpp reserves up front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compute {
    /// All of it.
    pub bytes: Bytes,
    /// The attention masks: every cache's cells times the batch, f16.
    pub mask: Bytes,
    /// The activations of the widest layer, for the batch.
    pub activations: Bytes,
}

/// A model's memory under chosen settings, each part shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The inputs it assumed.
    pub assumed: Assumed,
    /// The weights: the tensor table's sum.
    pub weights: Weights,
    /// The KV cache; `None` when not estimated (see `gaps`), zero for a model without one.
    pub kv_cache: Option<KvCache>,
    /// The recurrent state; `None` for a model without one, or when not estimated (see `gaps`).
    pub recurrent: Option<RecurrentState>,
    /// The compute buffer; `None` when not estimated.
    pub compute: Option<Compute>,
    /// The output buffer: each slot's logits (and embedding, for an embedding model), f32.
    pub output: Option<Bytes>,
    /// What could not be estimated, and why.
    pub gaps: Vec<Gap>,
    /// What was estimated on an assumption.
    pub caveats: Vec<Caveat>,
}

impl Estimate {
    /// Everything estimated, together. With gaps, the least the model needs, not what it needs.
    pub fn total(&self) -> Bytes {
        self.beside_cache() + self.kv_cache.map_or(Bytes::ZERO, |kv| kv.bytes)
    }

    /// Everything but the KV cache, which grows with the context: the weights, the recurrent state, the
    /// compute buffers and the output.
    pub fn beside_cache(&self) -> Bytes {
        self.weights.bytes
            + self.recurrent.map_or(Bytes::ZERO, |r| r.bytes)
            + self.compute.map_or(Bytes::ZERO, |c| c.bytes)
            + self.output.unwrap_or(Bytes::ZERO)
    }

    /// Whether every part was estimated.
    pub fn is_complete(&self) -> bool {
        self.gaps.is_empty()
    }
}

fn pad(n: u64, to: u32) -> u64 {
    n.div_ceil(u64::from(to)).saturating_mul(u64::from(to))
}

fn cells_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Estimates the memory llama.cpp takes for `model` under `settings`.
///
/// Weights are exact. The KV cache follows llama.cpp's own sizing: the context padded to 256 cells per
/// slot (or for the shared pool), sliding-window layers holding the window plus a batch, encoders holding
/// none. So does the recurrent state: one per slot, whatever the context. The compute buffer is a model
/// measured against llama.cpp (BENCHMARKS.md, "The memory estimate against llama.cpp"): the masks plus the
/// live activations of the widest feed-forward or attention step.
pub fn estimate(model: &ModelInfo, settings: &Settings) -> Estimate {
    let slots = settings.slots.max(1);
    let mut caveats = model.caveats.clone();
    let (context, context_from_model) =
        match (settings.context.filter(|&c| c > 0), model.context_length) {
            (Some(c), _) => (c, false),
            (None, Some(c)) => (c.max(1), true),
            (None, None) => {
                caveats.push(Caveat::NoContextLength);
                (DEFAULT_CONTEXT, true)
            }
        };
    let ctx_size = u64::from(context) * u64::from(slots);
    let cacheless = model.cache == CacheKind::Cacheless;
    // llama.cpp's server caps the logical batch at -c; an encoder computes a whole input in one batch.
    let batch = if cacheless {
        settings.ubatch
    } else {
        settings.batch
    };
    let ubatch = u64::from(settings.ubatch.min(batch).max(1)).min(ctx_size);
    let (cells, streams) = if settings.unified_kv {
        (pad(ctx_size, CONTEXT_PAD), 1)
    } else {
        (pad(u64::from(context), CONTEXT_PAD), slots)
    };
    let batch_tokens = ubatch.min(cells.saturating_mul(u64::from(streams)));

    let mut gaps = model.gaps.clone();
    let assumed = Assumed {
        context,
        context_from_model,
        slots,
        ctx_size: cells_u32(ctx_size),
        cache_type_k: settings.cache_type_k,
        cache_type_v: settings.cache_type_v,
        unified_kv: settings.unified_kv,
        batch_tokens: cells_u32(batch_tokens),
    };

    let recurrent = model
        .recurrent
        .map(|shape| RecurrentState::sized(&shape, slots));

    // One output per slot: its logits, and for an embedding model its embedding too.
    let embedding = match model.kind {
        ModelKind::Generation => Some(0),
        ModelKind::Embedding | ModelKind::Reranking => {
            model.shape.as_ref().map(|s| u64::from(s.embedding))
        }
    };
    let output = model.vocab.zip(embedding).map(|(vocab, embedding)| {
        Bytes(
            u64::from(slots)
                .saturating_mul(u64::from(vocab) + embedding)
                .saturating_mul(ACTIVATION),
        )
    });
    if model.vocab.is_none() {
        gaps.push(Gap::NoVocabulary);
    }

    let Some(shape) = &model.shape else {
        // Without attention (Mamba, RWKV) there is no KV cache at all.
        return Estimate {
            assumed,
            weights: model.weights.clone(),
            kv_cache: (model.cache == CacheKind::Recurrent).then_some(KvCache::NONE),
            recurrent,
            compute: None,
            output,
            gaps,
            caveats,
        };
    };

    let kv_cache = if cacheless {
        Some(KvCache::NONE)
    } else {
        kv_cache(shape, settings, cells, streams, ubatch, &mut gaps)
    };

    // Each cache's mask is one stream's cells times the batch (the batch's tokens spread over the streams);
    // an encoder's is the batch squared.
    let (mask_cells, caches) = match kv_cache {
        Some(kv) if !cacheless => {
            let full = u64::from(kv.cells) * u64::from(kv.layers > 0);
            let swa = u64::from(kv.swa_cells) * u64::from(kv.swa_layers > 0);
            (
                full + swa,
                u64::from(kv.layers > 0) + u64::from(kv.swa_layers > 0),
            )
        }
        _ => (batch_tokens, 0),
    };
    let mask = Bytes(mask_cells.saturating_mul(batch_tokens) * MASK_CELL);
    let per_token = live_width(shape).saturating_mul(ACTIVATION)
        + INPUT_BYTES_PER_TOKEN
        + caches * CACHE_INDEX_BYTES_PER_TOKEN;
    let activations = Bytes(batch_tokens.saturating_mul(per_token));
    let compute = Compute {
        bytes: mask + activations,
        mask,
        activations,
    };

    Estimate {
        assumed,
        weights: model.weights.clone(),
        kv_cache,
        recurrent,
        compute: Some(compute),
        output,
        gaps,
        caveats,
    }
}

/// The KV cache of the layers that keep one: full-context layers hold `cells` per stream, sliding-window
/// layers the window (times the slots when the pool is shared) plus a batch, padded, at most `cells`.
fn kv_cache(
    shape: &Shape,
    settings: &Settings,
    cells: u64,
    streams: u32,
    ubatch: u64,
    gaps: &mut Vec<Gap>,
) -> Option<KvCache> {
    let swa_cells = match shape.sliding_window {
        Some(_) if settings.swa_full => cells,
        Some(window) => {
            let per = if settings.unified_kv {
                u64::from(window).saturating_mul(u64::from(settings.slots.max(1)))
            } else {
                u64::from(window)
            };
            pad(cells.min(per.saturating_add(ubatch)), CONTEXT_PAD)
        }
        None => 0,
    };
    let mut full = Bytes::ZERO;
    let mut swa = Bytes::ZERO;
    let (mut layers, mut swa_layers) = (0u32, 0u32);
    for il in 0..shape.layers as usize {
        if !shape.has_kv(il) {
            continue;
        }
        let (k, v) = shape.kv_widths(il);
        let (Some(k_row), Some(v_row)) = (
            settings.cache_type_k.row_bytes(k),
            settings.cache_type_v.row_bytes(v),
        ) else {
            gaps.push(Gap::CacheTypeMismatch {
                layer: il as u32,
                k_width: k,
                v_width: v,
                cache_type_k: settings.cache_type_k,
                cache_type_v: settings.cache_type_v,
            });
            return None;
        };
        let is_swa = shape.is_swa(il);
        let layer_cells = if is_swa { swa_cells } else { cells };
        let bytes = Bytes(
            (k_row + v_row)
                .saturating_mul(layer_cells)
                .saturating_mul(u64::from(streams)),
        );
        if is_swa {
            swa += bytes;
            swa_layers += 1;
        } else {
            full += bytes;
            layers += 1;
        }
    }
    Some(KvCache {
        bytes: full + swa,
        cells: cells_u32(cells),
        streams,
        layers,
        swa_layers,
        swa_cells: cells_u32(swa_cells),
        swa_bytes: swa,
    })
}

/// Activations alive at once per token, in elements, at the widest step of a layer, measured against
/// llama.cpp 2026.10 on CPU (`scripts/bench-estimate`): a gated feed-forward block holds gate, up and their
/// product (three widths) and an ungated one a single width, next to five embedding-wide tensors
/// (residuals, norms, the allocator's leftovers); attention peaks with the queries three times over. A
/// mixture of experts also peaks where the chosen experts' outputs (one embedding each) are summed: that
/// term is the fit that came within 17 % of twelve measured shapes, where the allocator's placement, not
/// the live tensors alone, decides the peak.
fn live_width(shape: &Shape) -> u64 {
    let e = u64::from(shape.embedding);
    let f = shape.ffn.active_width();
    let live_ffn = if shape.ffn.gated { 3 } else { 1 };
    let (mut q, mut kv) = (0u64, 0u64);
    for il in 0..shape.layers as usize {
        let heads = u64::from(shape.heads.get(il).copied().unwrap_or(0));
        let kv_heads = u64::from(shape.kv_heads.get(il).copied().unwrap_or(0));
        q = q.max(heads * u64::from(shape.key_length));
        kv = kv.max(kv_heads * u64::from(shape.key_length));
    }
    let ffn = live_ffn * f + 5 * e;
    let experts = shape
        .ffn
        .experts
        .map_or(0, |x| u64::from(x.used) * e + 2 * f + 9 * e / 2);
    let attention = (3 * e + 3 * q + kv).max(e + 3 * q + 3 * kv);
    ffn.max(experts).max(attention)
}
