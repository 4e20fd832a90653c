//! What a GGUF header says about the model that memory depends on: layers, widths, heads, sliding windows,
//! the feed-forward shape, whether it keeps a KV cache at all and how wide a recurrent state it keeps. Its own
//! room because this is where llama.cpp's per-architecture knowledge is copied (`llama_model::load_hparams`
//! and `create_memory` in src/llama-model.cpp, each architecture's `load_arch_hparams` in src/models/,
//! `n_embd_r` and `n_embd_s` in src/llama-hparams.cpp), and that knowledge changes with llama.cpp while the
//! arithmetic does not.

use super::gguf::{GgufHeader, Value};
use super::weights::{layer_of, weigh, Weights};
use super::{Caveat, Gap};
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// What the model is served for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    /// Text generation.
    Generation,
    /// Embeddings (a pooling type other than rank, or an encoder such as BERT).
    Embedding,
    /// Reranking (pooling type rank).
    Reranking,
}

/// How llama.cpp keeps what attention has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheKind {
    /// A KV cache for every layer with attention.
    Attention,
    /// None: an encoder that sees each input whole (BERT and its kin).
    Cacheless,
    /// A recurrent state per slot instead of a KV cache (Mamba, RWKV).
    Recurrent,
    /// A KV cache for the attention layers and a recurrent state for the others.
    Hybrid,
}

/// Rope scaling as the file states it. It changes no memory by itself; the context it allows does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// `linear`, `yarn`, `longrope`...
    pub kind: String,
    /// The factor, if stated.
    pub factor: Option<f64>,
    /// The context the model was trained at before scaling, if stated.
    pub original_context: Option<u32>,
}

/// The feed-forward blocks' shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ffn {
    /// The widest dense feed-forward block (or shared expert).
    pub width: u32,
    /// Gated (SwiGLU, GeGLU): gate and up are both alive with their product, three widths at once.
    pub gated: bool,
    /// Routed experts, for a mixture of experts.
    pub experts: Option<Experts>,
}

/// A mixture of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Experts {
    /// Experts per layer.
    pub count: u32,
    /// Experts each token goes through.
    pub used: u32,
    /// Width of one expert.
    pub width: u32,
}

impl Ffn {
    /// The width a token's activations take in the widest feed-forward block.
    pub fn active_width(&self) -> u64 {
        let routed = self
            .experts
            .map_or(0, |e| u64::from(e.width) * u64::from(e.used));
        u64::from(self.width).max(routed)
    }
}

/// The transformer's shape: what the KV cache and the compute buffers are sized from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shape {
    /// Repeating layers (`{arch}.block_count`).
    pub layers: u32,
    /// Embedding width (`{arch}.embedding_length`).
    pub embedding: u32,
    /// Query heads per layer.
    pub heads: Vec<u32>,
    /// KV heads per layer; 0 for a layer without attention (the recurrent layers of a hybrid).
    pub kv_heads: Vec<u32>,
    /// Key width per head.
    pub key_length: u32,
    /// Value width per head.
    pub value_length: u32,
    /// Key width per head in sliding-window layers.
    pub key_length_swa: u32,
    /// Value width per head in sliding-window layers.
    pub value_length_swa: u32,
    /// Multi-head latent attention (DeepSeek): the cache holds the compressed keys only.
    pub latent_attention: bool,
    /// The sliding window in tokens, for models that have one.
    pub sliding_window: Option<u32>,
    /// Which layers attend through the sliding window (empty: none).
    pub swa_layers: Vec<bool>,
    /// Layers from this one on reuse an earlier layer's cache (Gemma 3n); `layers` when none do.
    pub own_kv_layers: u32,
    /// The feed-forward blocks.
    pub ffn: Ffn,
}

impl Shape {
    /// Whether layer `il` keeps a KV cache of its own.
    pub fn has_kv(&self, il: usize) -> bool {
        il < self.own_kv_layers as usize && self.kv_heads.get(il).is_some_and(|&h| h > 0)
    }

    /// Whether layer `il` attends through the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// K and V widths of layer `il`'s cache rows (`n_embd_k_gqa`, `n_embd_v_gqa`).
    pub fn kv_widths(&self, il: usize) -> (u64, u64) {
        let kv_heads = u64::from(self.kv_heads.get(il).copied().unwrap_or(0));
        let (k, v) = if self.is_swa(il) {
            (self.key_length_swa, self.value_length_swa)
        } else {
            (self.key_length, self.value_length)
        };
        let v = if self.latent_attention { 0 } else { v };
        (u64::from(k) * kv_heads, u64::from(v) * kv_heads)
    }
}

/// The recurrent state of a model that keeps one: llama.cpp's `llama_memory_recurrent`, which holds for each
/// recurrent layer and each sequence one row of `r_width` and one of `s_width` elements, f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecurrentShape {
    /// Layers that keep a recurrent state.
    pub layers: u32,
    /// Its rolling part per layer and sequence (`n_embd_r`): the convolution's last inputs (Mamba, LFM2's short
    /// convolution, Kimi's delta attention) or the token shift (RWKV).
    pub r_width: u64,
    /// Its state proper per layer and sequence (`n_embd_s`): the SSM's (Mamba), the WKV's (RWKV) or the delta
    /// rule's (Kimi); none for LFM2.
    pub s_width: u64,
}

/// Everything the estimate needs from a GGUF header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// `general.architecture`.
    pub architecture: Option<String>,
    /// `general.name`.
    pub name: Option<String>,
    /// Generation, embedding or reranking.
    pub kind: ModelKind,
    /// How it keeps what attention has seen.
    pub cache: CacheKind,
    /// The context it was trained for (`{arch}.context_length`): llama.cpp's default context.
    pub context_length: Option<u32>,
    /// Rope scaling, if any.
    pub rope_scaling: Option<RopeScaling>,
    /// Vocabulary size: the output head's rows.
    pub vocab: Option<u32>,
    /// The transformer's shape; `None` for a model without attention (Mamba, RWKV) or when a key it needs
    /// is missing (see `gaps`).
    pub shape: Option<Shape>,
    /// The recurrent state's shape; `None` for a model without one, or when it cannot be read (see `gaps`).
    pub recurrent: Option<RecurrentShape>,
    /// The weights, from the tensor table.
    pub weights: Weights,
    /// What could not be estimated, and why.
    pub gaps: Vec<Gap>,
    /// What was estimated on an assumption.
    pub caveats: Vec<Caveat>,
}

/// Encoders llama.cpp runs with no KV cache (`create_memory` returns none for them).
const CACHELESS: [&str; 14] = [
    "bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "modern-bert",
    "eurobert",
    "gemma-embedding",
    "llama-embed",
    "wavtokenizer-dec",
    "dream",
    "llada",
    "llada-moe",
];

/// Architectures with a recurrent state and no attention.
const RECURRENT: [&str; 6] = ["mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"];

/// Architectures that mix attention layers with recurrent ones (`llm_arch_is_hybrid` in src/llama-arch.cpp,
/// less DeepSeek V4, whose memory is a KV cache of its own).
const HYBRID: [&str; 17] = [
    "jamba",
    "falcon-h1",
    "granitehybrid",
    "nemotron_h",
    "nemotron_h_moe",
    "lfm2",
    "lfm2moe",
    "plamo2",
    "qwen3next",
    "qwen35",
    "qwen35moe",
    "kimi-linear",
    "bailingmoe3",
    "kimi-k3",
    "glm5-next",
    "qwen4exp",
    "minimax-01",
];

/// Hybrids whose recurrent layers are listed (`attention.recurrent_layers`) or else follow from the interval
/// of their attention layers (`full_attention_interval`, 4 where the file states none).
const INTERVAL_HYBRIDS: [&str; 3] = ["qwen3next", "qwen35", "qwen35moe"];

/// Hybrids whose dense feed-forward layers keep neither a KV cache nor a recurrent state.
const NEMOTRON_H: [&str; 2] = ["nemotron_h", "nemotron_h_moe"];

/// How an architecture sizes its recurrent state: which branch of llama.cpp's `n_embd_r` and `n_embd_s` its
/// keys take it down.
#[derive(Clone, Copy)]
enum StateKind {
    /// RWKV: a token shift and a WKV state.
    Rwkv,
    /// LFM2: a short convolution's last inputs, no state proper.
    ShortConv,
    /// Kimi's delta attention: three convolutions' last inputs and one state per head.
    DeltaAttention,
    /// Mamba's selective scan; `groups` where the architecture reads a group count (Mamba-2 mixers).
    Mamba { groups: bool },
}

fn state_kind(arch: &str) -> Option<StateKind> {
    match arch {
        "rwkv6" | "rwkv6qwen2" | "rwkv7" | "arwkv7" => Some(StateKind::Rwkv),
        "lfm2" | "lfm2moe" => Some(StateKind::ShortConv),
        "kimi-linear" => Some(StateKind::DeltaAttention),
        "mamba" | "jamba" => Some(StateKind::Mamba { groups: false }),
        "mamba2" | "falcon-h1" | "granitehybrid" | "nemotron_h" | "nemotron_h_moe" | "plamo2"
        | "qwen3next" | "qwen35" | "qwen35moe" => Some(StateKind::Mamba { groups: true }),
        _ => None,
    }
}

/// Sliding-window layouts llama.cpp sets per architecture (`set_swa_pattern(n)`: of every `n` layers, all
/// but the last use the window), with the window when the file states none.
const SWA_PATTERNS: [(&str, u32, Option<u32>); 7] = [
    ("gemma2", 2, Some(4096)),
    ("gemma3", 6, None),
    ("gemma3n", 5, None),
    ("gemma-embedding", 6, None),
    ("cohere2", 4, None),
    ("exaone4", 4, None),
    ("gpt-oss", 2, None),
];

/// Architectures whose `sliding_window` key llama.cpp reads and then ignores, attending to the full context
/// in every layer.
const SWA_IGNORED: [&str; 5] = ["phi3", "llama", "qwen2", "mistral3", "starcoder2"];

/// `set_swa_pattern`: of every `n` layers, all but the last use the window; 0 means all of them.
fn swa_pattern(layers: u32, n: u32) -> Vec<bool> {
    (0..layers).map(|il| n == 0 || il % n < n - 1).collect()
}

struct Keys<'a> {
    header: &'a GgufHeader,
    arch: String,
}

impl Keys<'_> {
    fn get(&self, suffix: &str) -> Option<&Value> {
        self.header.get(&format!("{}.{suffix}", self.arch))
    }

    fn u32(&self, suffix: &str) -> Option<u32> {
        self.get(suffix).and_then(Value::as_u32)
    }

    /// A key that is one number for all layers or an array with one per layer.
    fn per_layer(&self, suffix: &str, layers: u32) -> Option<Vec<u32>> {
        match self.get(suffix)? {
            Value::Array(array) if array.items.len() as u64 == array.len => {
                let each: Option<Vec<u32>> = array.items.iter().map(Value::as_u32).collect();
                each.filter(|v| v.len() == layers as usize)
            }
            value => value.as_u32().map(|v| vec![v; layers as usize]),
        }
    }
}

impl ModelInfo {
    /// Reads a model's description from its header. `file_len`, when known, sizes a last tensor of an
    /// unknown type from where the file ends.
    pub fn from_header(header: &GgufHeader, file_len: Option<Bytes>) -> ModelInfo {
        let (weights, mut gaps) = weigh(header, file_len);
        let mut caveats = Vec::new();
        let architecture = header
            .get("general.architecture")
            .and_then(Value::as_str)
            .map(str::to_string);
        let keys = Keys {
            header,
            arch: architecture.clone().unwrap_or_default(),
        };
        let arch = keys.arch.as_str();
        if architecture.is_none() {
            gaps.push(Gap::MissingKey {
                key: "general.architecture".into(),
            });
        }

        let pooling = keys.u32("pooling_type");
        let causal = keys
            .get("attention.causal")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let cache = if CACHELESS.contains(&arch) {
            CacheKind::Cacheless
        } else if RECURRENT.contains(&arch) {
            CacheKind::Recurrent
        } else if HYBRID.contains(&arch) {
            CacheKind::Hybrid
        } else {
            CacheKind::Attention
        };
        let kind = match pooling {
            Some(4) => ModelKind::Reranking,
            Some(1..=3) => ModelKind::Embedding,
            _ if cache == CacheKind::Cacheless || !causal => ModelKind::Embedding,
            _ => ModelKind::Generation,
        };
        let recurrent = if matches!(cache, CacheKind::Recurrent | CacheKind::Hybrid) {
            read_recurrent(&keys, cache)
                .map_err(|missing_key| {
                    gaps.push(Gap::RecurrentState {
                        architecture: arch.to_string(),
                        hybrid: cache == CacheKind::Hybrid,
                        missing_key,
                    });
                })
                .ok()
        } else {
            None
        };
        match cache {
            CacheKind::Recurrent => gaps.push(Gap::RecurrentCompute {
                architecture: arch.to_string(),
            }),
            CacheKind::Hybrid => caveats.push(Caveat::RecurrentCompute),
            CacheKind::Attention | CacheKind::Cacheless => {}
        }

        let rope_scaling = keys
            .get("rope.scaling.type")
            .and_then(Value::as_str)
            .filter(|kind| *kind != "none")
            .map(|kind| RopeScaling {
                kind: kind.to_string(),
                factor: keys.get("rope.scaling.factor").and_then(Value::as_f64),
                original_context: keys.u32("rope.scaling.original_context_length"),
            });

        let tensor = |name: &str| header.tensors.iter().find(|t| t.name == name);
        let vocab = tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .or_else(|| {
                header
                    .get("tokenizer.ggml.tokens")
                    .and_then(Value::as_array)
                    .map(|a| a.len)
            })
            .or_else(|| keys.get("vocab_size").and_then(Value::as_u64))
            .and_then(|v| u32::try_from(v).ok());

        let shape = if cache == CacheKind::Recurrent || architecture.is_none() {
            None
        } else {
            read_shape(&keys, cache, header, &mut gaps, &mut caveats)
        };

        ModelInfo {
            name: header
                .get("general.name")
                .and_then(Value::as_str)
                .map(str::to_string),
            architecture,
            kind,
            cache,
            context_length: keys.u32("context_length"),
            rope_scaling,
            vocab,
            shape,
            recurrent,
            weights,
            gaps,
            caveats,
        }
    }
}

/// The recurrent state's shape, from the keys each architecture's `load_arch_hparams` reads, by llama.cpp's
/// `n_embd_r` and `n_embd_s` (src/llama-hparams.cpp). The error is the first of those keys the file lacks, or
/// `None` for an architecture whose state is not sized here.
fn read_recurrent(keys: &Keys, cache: CacheKind) -> Result<RecurrentShape, Option<String>> {
    let arch = keys.arch.as_str();
    let kind = state_kind(arch).ok_or(None)?;
    let need = |suffix: &str| {
        keys.u32(suffix)
            .map(u64::from)
            .ok_or_else(|| Some(format!("{arch}.{suffix}")))
    };
    let layers = keys
        .u32("block_count")
        .ok_or_else(|| Some(format!("{arch}.block_count")))?;
    let heads = keys.per_layer("attention.head_count", layers);
    let (r_width, s_width) = match kind {
        StateKind::Rwkv => {
            let embedding = need("embedding_length")?;
            // llama_hparams::token_shift_count defaults to 2.
            let shifts = u64::from(keys.u32("token_shift_count").unwrap_or(2));
            (shifts * embedding, embedding * need("wkv.head_size")?)
        }
        StateKind::ShortConv => (
            need("embedding_length")? * need("shortconv.l_cache")?.saturating_sub(1),
            0,
        ),
        StateKind::DeltaAttention => {
            let conv = need("ssm.conv_kernel")?;
            let head = need("kda.head_dim")?;
            // `n_head()`: the first layer's.
            let first_heads = heads
                .as_ref()
                .and_then(|h| h.first().copied())
                .ok_or_else(|| Some(format!("{arch}.attention.head_count")))?;
            let inner = u64::from(first_heads) * head;
            let taps = if conv > 0 { conv - 1 } else { 3 };
            (3 * taps * inner, head * inner)
        }
        StateKind::Mamba { groups } => {
            let conv = need("ssm.conv_kernel")?;
            let inner = need("ssm.inner_size")?;
            let state = need("ssm.state_size")?;
            let groups = if groups { need("ssm.group_count")? } else { 0 };
            // The convolution's first column is shifted out at each step, so it keeps d_conv - 1 of them.
            (
                conv.saturating_sub(1) * (inner + 2 * groups * state),
                state * inner,
            )
        }
    };
    // llama.cpp takes missing KV head counts to be the head counts, and missing head counts to be 0.
    let kv_heads = keys
        .per_layer("attention.head_count_kv", layers)
        .or(heads)
        .unwrap_or_else(|| vec![0; layers as usize]);
    let recurrent = recurrent_layers(keys, cache, layers, &kv_heads);
    Ok(RecurrentShape {
        layers: recurrent.iter().filter(|&&r| r).count() as u32,
        r_width,
        s_width,
    })
}

/// Which layers are recurrent, as each architecture's `load_arch_hparams` marks them (`is_recr`). llama.cpp's
/// recurrent memory covers none of the layers appended for multi-token prediction (`nextn_predict_layers`).
fn recurrent_layers(keys: &Keys, cache: CacheKind, layers: u32, kv_heads: &[u32]) -> Vec<bool> {
    let arch = keys.arch.as_str();
    let trunk = layers.saturating_sub(keys.u32("nextn_predict_layers").unwrap_or(0)) as usize;
    let listed = keys
        .get("attention.recurrent_layers")
        .and_then(Value::as_array)
        .filter(|a| a.items.len() == layers as usize);
    let interval = keys
        .u32("full_attention_interval")
        .or(INTERVAL_HYBRIDS.contains(&arch).then_some(4))
        .filter(|&n| n > 0);
    let ffn = keys.per_layer("feed_forward_length", layers);
    let is_recurrent = |il: usize| {
        let no_kv = kv_heads.get(il).is_some_and(|&h| h == 0);
        if il >= trunk {
            return false;
        }
        if cache == CacheKind::Recurrent || arch == "falcon-h1" {
            return true;
        }
        if NEMOTRON_H.contains(&arch) {
            return no_kv && ffn.as_ref().is_none_or(|f| f[il] == 0);
        }
        if let Some(listed) = listed {
            let item = &listed.items[il];
            return item.as_bool().or_else(|| item.as_u32().map(|n| n != 0)) == Some(true);
        }
        match interval {
            Some(n) => !(il as u32 + 1).is_multiple_of(n),
            None => cache == CacheKind::Hybrid && no_kv,
        }
    };
    (0..layers as usize).map(is_recurrent).collect()
}

fn read_shape(
    keys: &Keys,
    cache: CacheKind,
    header: &GgufHeader,
    gaps: &mut Vec<Gap>,
    caveats: &mut Vec<Caveat>,
) -> Option<Shape> {
    let arch = keys.arch.as_str();
    let missing = |gaps: &mut Vec<Gap>, suffix: &str| {
        gaps.push(Gap::MissingKey {
            key: format!("{arch}.{suffix}"),
        });
    };
    let (Some(layers), Some(embedding)) = (keys.u32("block_count"), keys.u32("embedding_length"))
    else {
        for key in ["block_count", "embedding_length"] {
            if keys.u32(key).is_none() {
                missing(gaps, key);
            }
        }
        return None;
    };
    let Some(heads) = keys.per_layer("attention.head_count", layers) else {
        missing(gaps, "attention.head_count");
        return None;
    };
    let mut kv_heads = keys
        .per_layer("attention.head_count_kv", layers)
        .unwrap_or_else(|| heads.clone());
    // A hybrid keeps a KV cache in its attention layers alone (`create_memory`'s attention filter): not in
    // its recurrent layers, except Falcon-H1's, where attention and the SSM run side by side, nor in
    // Nemotron-H's feed-forward layers.
    let recurrent = recurrent_layers(keys, cache, layers, &kv_heads);
    let ffn_widths = keys.per_layer("feed_forward_length", layers);
    for (il, h) in kv_heads.iter_mut().enumerate() {
        let dense = NEMOTRON_H.contains(&arch) && ffn_widths.as_ref().is_some_and(|f| f[il] > 0);
        if (recurrent[il] && arch != "falcon-h1") || dense {
            *h = 0;
        }
    }
    let first_heads = heads.iter().copied().find(|&h| h > 0).unwrap_or(1);
    let key_length = keys
        .u32("attention.key_length")
        .unwrap_or(embedding / first_heads);
    let value_length = keys
        .u32("attention.value_length")
        .unwrap_or(embedding / first_heads);

    let sliding_window = keys.u32("attention.sliding_window").filter(|&w| w > 0);
    let pattern = SWA_PATTERNS.iter().find(|p| p.0 == arch);
    let (sliding_window, swa_layers) = match keys.get("attention.sliding_window_pattern") {
        Some(Value::Array(array)) if array.items.len() == layers as usize => (
            sliding_window,
            array
                .items
                .iter()
                .map(|v| v.as_bool().unwrap_or(false))
                .collect(),
        ),
        Some(Value::Uint(n)) => (
            sliding_window,
            swa_pattern(layers, u32::try_from(*n).unwrap_or(0)),
        ),
        _ => match pattern {
            Some(&(_, n, default)) => match sliding_window.or(default) {
                Some(w) => (Some(w), swa_pattern(layers, n)),
                None => (None, Vec::new()),
            },
            None => {
                if sliding_window.is_some() && !SWA_IGNORED.contains(&arch) {
                    caveats.push(Caveat::SlidingWindowLayersUnknown {
                        architecture: arch.to_string(),
                    });
                }
                (None, Vec::new())
            }
        },
    };
    let swa_layers = if sliding_window.is_some() {
        swa_layers
    } else {
        Vec::new()
    };

    let own_kv_layers = keys
        .u32("attention.shared_kv_layers")
        .map_or(layers, |shared| layers.saturating_sub(shared));
    let latent_attention = keys.get("attention.key_length_mla").is_some();
    if latent_attention {
        caveats.push(Caveat::LatentAttention);
    }

    let ffn = read_ffn(keys, header, layers);
    if ffn.experts.is_some() {
        caveats.push(Caveat::MixtureOfExperts);
    }

    Some(Shape {
        layers,
        embedding,
        heads,
        kv_heads,
        key_length,
        value_length,
        key_length_swa: keys.u32("attention.key_length_swa").unwrap_or(key_length),
        value_length_swa: keys
            .u32("attention.value_length_swa")
            .unwrap_or(value_length),
        latent_attention,
        sliding_window,
        swa_layers,
        own_kv_layers,
        ffn,
    })
}

/// The feed-forward shape, from the tensors themselves where they say it (a fused gate-and-up tensor is
/// twice as wide as the block), else from `{arch}.feed_forward_length`.
fn read_ffn(keys: &Keys, header: &GgufHeader, layers: u32) -> Ffn {
    let mut width = 0u32;
    let mut gated = false;
    let mut expert_width = 0u32;
    for t in &header.tensors {
        if layer_of(&t.name).is_none() {
            continue;
        }
        let out = t
            .dims
            .get(1)
            .and_then(|&d| u32::try_from(d).ok())
            .unwrap_or(0);
        let kind = t.name.split('.').nth(2).unwrap_or("");
        match kind {
            "ffn_up" | "ffn_up_shexp" => width = width.max(out),
            "ffn_gate" | "ffn_gate_shexp" | "ffn_gate_exps" | "ffn_gate_up_exps" => gated = true,
            "ffn_up_exps" => expert_width = expert_width.max(out),
            _ => {}
        }
    }
    let stated = keys
        .per_layer("feed_forward_length", layers)
        .and_then(|w| w.into_iter().max())
        .unwrap_or(0);
    if !gated && stated > 0 && width == 2 * stated {
        // Gate and up in one tensor (Phi-3): the block is half as wide, and gated.
        width = stated;
        gated = true;
    }
    if width == 0 {
        width = stated;
    }
    let experts = match (keys.u32("expert_count"), keys.u32("expert_used_count")) {
        (Some(count), Some(used)) if count > 0 && used > 0 => Some(Experts {
            count,
            used,
            width: if expert_width > 0 {
                expert_width
            } else {
                keys.u32("expert_feed_forward_length").unwrap_or(stated)
            },
        }),
        _ => None,
    };
    Ffn {
        width,
        gated,
        experts,
    }
}
