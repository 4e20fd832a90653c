//! A model's memory from its own GGUF file, before it runs: weights (exact, from the tensor table), the KV
//! cache for a chosen context, slots and cache type and the recurrent state for the slots (as llama.cpp sizes
//! them), and the compute and output buffers (a model measured against llama.cpp), each part shown with the
//! inputs it assumed.
//!
//! No I/O: the caller reads the first bytes of the file and hands them over ([`GgufHeader::parse`] says how
//! many more it needs when they are too few). What cannot be estimated (an unknown tensor type, a missing key,
//! the compute buffers of a model without attention) is named in [`Estimate::gaps`] and the rest is still
//! estimated; nothing is made up.
//!
//! - [`gguf`]: the header: metadata and tensor table.
//! - [`hf`]: a Hugging Face folder (config.json, safetensors headers) under vLLM or SGLang.
//! - [`ggml_type`]: each tensor type's block and its bytes.
//! - [`weights`]: the tensor table summed.
//! - [`model`]: what the header says that memory depends on.
//! - [`memory`]: the estimate itself.
//! - [`fit`]: llama.cpp's context (and layers on the GPU) chosen to fit a share.
//! - `writer` (tests and feature `testing`): a tiny GGUF writer.
//!
//! How close it comes to what llama.cpp allocates is measured by `scripts/bench-estimate` (BENCHMARKS.md).

pub mod fit;
pub mod ggml_type;
pub mod gguf;
pub mod hf;
pub mod memory;
pub mod model;
pub mod weights;
#[cfg(any(test, feature = "testing"))]
pub mod writer;

#[cfg(test)]
mod tests;

pub use fit::{
    cache_tokens_within, cautious, fit_share, judge, Fitted, Judged, Unfit, CAUTIOUS_CONTEXT,
};
pub use ggml_type::GgmlType;
pub use gguf::{GgufError, GgufHeader, TensorInfo, Value};
pub use memory::{
    cache_type, estimate, Assumed, Compute, Estimate, KvCache, RecurrentState, Settings,
    SettingsError, CACHE_TYPES, MAX_SLOTS,
};
pub use model::{CacheKind, ModelInfo, ModelKind, RecurrentShape, Shape};
pub use weights::Weights;

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Reads a header from the first bytes of a GGUF file and estimates its memory under `settings`.
/// `file_len`, when known, sizes a last tensor of an unknown type.
pub fn estimate_gguf(
    prefix: &[u8],
    file_len: Option<Bytes>,
    settings: &Settings,
) -> Result<Estimate, GgufError> {
    let header = GgufHeader::parse(prefix)?;
    Ok(estimate(
        &ModelInfo::from_header(&header, file_len),
        settings,
    ))
}

/// A part that could not be estimated, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "gap", rename_all = "snake_case")]
pub enum Gap {
    /// A tensor type ggml does not know.
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// Its type number.
        type_id: u32,
        /// Its size taken from the offsets around it (exact to the alignment), when they tell it.
        sized_from_offsets: Option<Bytes>,
    },
    /// A tensor type ggml has removed.
    RemovedTensorType {
        /// The tensor.
        tensor: String,
        /// Its type number.
        type_id: u32,
        /// ggml's name for it.
        name: String,
    },
    /// A tensor whose rows are not whole blocks of its type.
    PartialBlock {
        /// The tensor.
        tensor: String,
        /// Its type.
        ggml_type: GgmlType,
        /// Elements in a row.
        row: u64,
    },
    /// A metadata key the KV cache and compute buffers are sized from.
    MissingKey {
        /// The key.
        key: String,
    },
    /// A recurrent state (Mamba, RWKV, the recurrent layers of a hybrid) that cannot be sized.
    RecurrentState {
        /// The architecture.
        architecture: String,
        /// Attention layers beside the recurrent ones, whose KV cache and compute are estimated.
        hybrid: bool,
        /// The metadata key it is sized from that the file lacks; `None` for an architecture whose state
        /// Tessera does not know how to size.
        missing_key: Option<String>,
    },
    /// The compute buffers of a model without attention (Mamba, RWKV): their model is measured on attention
    /// and feed-forward blocks.
    RecurrentCompute {
        /// The architecture.
        architecture: String,
    },
    /// No vocabulary size, so no output buffer.
    NoVocabulary,
    /// Cache rows that are not whole blocks of the chosen cache type.
    CacheTypeMismatch {
        /// The first layer that does not fit.
        layer: u32,
        /// Its key row width.
        k_width: u64,
        /// Its value row width.
        v_width: u64,
        /// The key cache type.
        cache_type_k: GgmlType,
        /// The value cache type.
        cache_type_v: GgmlType,
    },
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gap::UnknownTensorType {
                tensor,
                type_id,
                sized_from_offsets,
            } => {
                write!(f, "unknown tensor type {type_id} for tensor {tensor}")?;
                match sized_from_offsets {
                    Some(bytes) => write!(
                        f,
                        "; its {} bytes are taken from where the next tensor starts",
                        bytes.get()
                    ),
                    None => f.write_str("; its bytes are not counted"),
                }
            }
            Gap::RemovedTensorType {
                tensor,
                type_id,
                name,
            } => write!(
                f,
                "tensor {tensor} has type {type_id} ({name}), which ggml has removed; llama.cpp no \
                 longer loads it, and its bytes are not counted"
            ),
            Gap::PartialBlock {
                tensor,
                ggml_type,
                row,
            } => write!(
                f,
                "tensor {tensor}: a row of {row} elements is not a whole number of {ggml_type} blocks \
                 ({}); its bytes are not counted",
                ggml_type.block_size()
            ),
            Gap::MissingKey { key } => write!(
                f,
                "metadata key {key} is missing, so the KV cache and compute buffers are not estimated"
            ),
            Gap::RecurrentState {
                architecture,
                hybrid,
                missing_key,
            } => {
                let layers = if *hybrid {
                    "in its recurrent layers"
                } else {
                    "instead of a KV cache"
                };
                write!(
                    f,
                    "{architecture} keeps a recurrent state per slot {layers}, which is not estimated: "
                )?;
                match missing_key {
                    Some(key) => write!(f, "metadata key {key} is missing"),
                    None => f.write_str("how this architecture sizes it is not known here"),
                }
            }
            Gap::RecurrentCompute { architecture } => write!(
                f,
                "{architecture} has no attention: its compute buffers are not estimated, their model being \
                 measured on attention and feed-forward blocks"
            ),
            Gap::NoVocabulary => f.write_str(
                "the file states no vocabulary size, so the output buffer is not estimated",
            ),
            Gap::CacheTypeMismatch {
                layer,
                k_width,
                v_width,
                cache_type_k,
                cache_type_v,
            } => write!(
                f,
                "layer {layer}'s cache rows ({k_width} keys, {v_width} values) are not whole blocks of \
                 {cache_type_k}/{cache_type_v}; llama.cpp refuses that cache type for this model, so the \
                 KV cache is not estimated"
            ),
        }
    }
}

/// A part estimated on an assumption the file does not settle, or by a rule not measured for this kind of
/// model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "caveat", rename_all = "snake_case")]
pub enum Caveat {
    /// A sliding window on an architecture whose layout Tessera does not know.
    SlidingWindowLayersUnknown {
        /// The architecture.
        architecture: String,
    },
    /// A mixture of experts.
    MixtureOfExperts,
    /// Multi-head latent attention.
    LatentAttention,
    /// No context length in the file.
    NoContextLength,
    /// vLLM's and SGLang's own overheads, which are constants, not read from the model.
    EngineOverheads,
    /// A hybrid's compute buffer, modelled on its attention and feed-forward blocks alone: an undercount
    /// (`granite-h` and `granite-h-wide` in `scripts/bench-estimate`).
    RecurrentCompute,
}

impl fmt::Display for Caveat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caveat::SlidingWindowLayersUnknown { architecture } => write!(
                f,
                "{architecture} has a sliding window, but which layers use it is not known here: every \
                 layer's KV cache is counted at the full context, an upper bound"
            ),
            Caveat::MixtureOfExperts => f.write_str(
                "a mixture of experts: its compute buffer came within 17 % of llama.cpp's on the shapes \
                 measured, not within the 1 % of a dense model",
            ),
            Caveat::LatentAttention => f.write_str(
                "multi-head latent attention: the KV cache holds the compressed keys alone, which is \
                 not measured against llama.cpp",
            ),
            Caveat::EngineOverheads => write!(
                f,
                "the compute part is vLLM's profiled activation peak for its batched tokens, plus CUDA \
                 graphs ({}) and memory outside PyTorch ({}): constants from vLLM's own logs on an H100, \
                 not measured here; SGLang is taken to be the same",
                hf::CUDA_GRAPHS.size_text(),
                hf::NON_TORCH.size_text()
            ),
            Caveat::RecurrentCompute => f.write_str(
                "a hybrid: its compute buffer is modelled on its attention and feed-forward blocks, not on \
                 its recurrent layers' scans (whose activations grow with the slots), so it is low: 14 % to \
                 34 % below llama.cpp's on the shapes measured, the more slots the lower",
            ),
            Caveat::NoContextLength => write!(
                f,
                "the file states no context length; {} tokens are assumed",
                memory::DEFAULT_CONTEXT
            ),
        }
    }
}
