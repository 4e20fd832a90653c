use super::writer::{block, llama, Gguf, V};
use super::*;
use crate::units::Bytes;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn info(g: &Gguf) -> ModelInfo {
    ModelInfo::from_header(&GgufHeader::parse(&g.header()).unwrap(), None)
}

fn settings(context: u32, slots: u32) -> Settings {
    Settings {
        context: Some(context),
        slots,
        ..Settings::default()
    }
}

fn mib(bytes: Bytes) -> f64 {
    bytes.get() as f64 / MIB as f64
}

#[test]
fn a_header_reads_back_as_written() {
    let g = llama(2, 256, 512, 4, 2, 1000, 1).kv("general.name", V::Str("tiny"));
    let h = GgufHeader::parse(&g.header()).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.get("general.name").and_then(Value::as_str), Some("tiny"));
    assert_eq!(h.get("llama.block_count").and_then(Value::as_u32), Some(2));
    assert_eq!(h.tensors.len(), 3 + 2 * 9);
    assert_eq!(h.tensors[2].name, "output.weight");
    assert_eq!(h.tensors[2].dims, vec![256, 1000]);
    assert_eq!(h.data_offset, g.header().len() as u64);
    let tokens = h
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .unwrap();
    assert_eq!((tokens.len, tokens.items.len()), (1000, 0));
}

#[test]
fn a_big_endian_header_reads_the_same() {
    let mut g = llama(1, 64, 128, 4, 4, 300, 0);
    let little = GgufHeader::parse(&g.header()).unwrap();
    g.big_endian = true;
    assert_eq!(GgufHeader::parse(&g.header()).unwrap(), little);
}

#[test]
fn what_is_not_gguf_says_so() {
    let err = GgufHeader::parse(b"PK\x03\x04 a zip file").unwrap_err();
    assert_eq!(err, GgufError::NotGguf);
    assert_eq!(err.to_string(), "not a GGUF file");
    let mut v1 = b"GGUF".to_vec();
    v1.extend(1u32.to_le_bytes());
    assert_eq!(
        GgufHeader::parse(&v1).unwrap_err().to_string(),
        "GGUF version 1 is not supported (2 and 3 are)"
    );
}

#[test]
fn a_short_prefix_says_how_many_bytes_it_needs_until_it_has_them() {
    let full = llama(2, 256, 512, 4, 2, 3000, 8).header();
    let needed = |len: usize| match GgufHeader::parse(&full[..len]) {
        Err(GgufError::Truncated { needed }) => Some(needed),
        Ok(_) => None,
        Err(e) => panic!("{e}"),
    };
    // Every answer is a step forward, and reading what it asks reaches the whole header.
    let mut len = 10;
    while let Some(n) = needed(len) {
        assert!(n > len as u64 && n <= full.len() as u64, "{n}");
        len = n as usize;
    }
    assert!(GgufHeader::parse(&full[..len]).is_ok());
    // Growing the read to at least twice what was read takes a handful of reads.
    let (mut len, mut reads) = (4096, 1);
    while let Some(n) = needed(len) {
        len = (n as usize).max(2 * len).min(full.len());
        reads += 1;
    }
    assert!(reads <= 6, "{reads}");
    assert_eq!(
        GgufHeader::parse(&full[..100]).unwrap_err().to_string(),
        format!("truncated: need {} bytes", needed(100).unwrap())
    );
}

#[test]
fn a_garbage_length_is_refused_instead_of_asking_for_gigabytes() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend((1u64 << 40).to_le_bytes());
    assert!(matches!(
        GgufHeader::parse(&bytes),
        Err(GgufError::Implausible { .. })
    ));
}

#[test]
fn weights_are_the_tensor_table_summed_exactly() {
    let g = llama(3, 512, 1536, 8, 2, 2048, 12).tensor("blk.0.extra.weight", &[512], 1);
    let m = info(&g);
    assert_eq!(m.weights.bytes, Bytes(g.table_bytes()));
    assert!(m.weights.exact);
    assert_eq!(m.weights.tensors, 3 + 3 * 9 + 1);
    assert_eq!(m.weights.per_layer.len(), 3);
    let layers: Bytes = m.weights.per_layer.iter().copied().sum();
    assert_eq!(layers + m.weights.outside_layers, m.weights.bytes);
    assert_eq!(m.weights.by_type[0].ggml_type, "q4_K");
}

#[test]
fn an_unknown_tensor_type_is_named_and_sized_from_its_neighbours() {
    let g = llama(1, 256, 512, 4, 4, 512, 1)
        .raw_tensor("blk.0.ffn_odd.weight", &[256, 512], 99, 40_001)
        .tensor("blk.0.last.weight", &[256], 0);
    let m = info(&g);
    let gap = &m.gaps[0];
    assert_eq!(
        gap.to_string(),
        "unknown tensor type 99 for tensor blk.0.ffn_odd.weight; its 40032 bytes are taken from where \
         the next tensor starts"
    );
    // 40,001 bytes padded to the 32-byte alignment.
    assert_eq!(m.weights.bytes, Bytes(g.table_bytes() + 31));
    assert!(!m.weights.exact);
    let e = estimate(&m, &settings(1024, 1));
    assert!(e.kv_cache.is_some() && e.compute.is_some());
    assert!(!e.is_complete());
}

#[test]
fn the_last_tensor_of_an_unknown_type_needs_the_file_length() {
    let g = llama(1, 256, 512, 4, 4, 512, 1).raw_tensor("blk.0.odd.weight", &[256], 77, 1000);
    let h = GgufHeader::parse(&g.header()).unwrap();
    let unknown_size = ModelInfo::from_header(&h, None);
    assert_eq!(unknown_size.weights.bytes, Bytes(g.table_bytes() - 1000));
    assert!(unknown_size.gaps[0]
        .to_string()
        .ends_with("its bytes are not counted"));
    let file_len = Bytes(h.data_offset + g.table_bytes().div_ceil(32) * 32);
    let sized = ModelInfo::from_header(&h, Some(file_len));
    assert!(sized.weights.bytes >= Bytes(g.table_bytes()));
}

#[test]
fn a_removed_type_and_a_partial_block_are_gaps_with_reasons() {
    let g = llama(1, 256, 512, 4, 4, 512, 1)
        .raw_tensor("blk.0.old.weight", &[256, 4], 31, 576)
        .raw_tensor("blk.0.odd.weight", &[100, 4], 8, 0);
    let gaps: Vec<String> = info(&g).gaps.iter().map(ToString::to_string).collect();
    assert!(
        gaps[0].contains("type 31 (q4_0_4_4), which ggml has removed"),
        "{gaps:?}"
    );
    assert!(gaps[1].contains("a row of 100 elements is not a whole number of q8_0 blocks (32)"));
}

/// The cases below are what llama.cpp (PyPI xllamacpp 2026.10.11549, CPU) reported for the same shapes,
/// written by `scripts/bench-estimate`'s generator: its KV cache exactly, its compute buffer to the 0.01 MiB
/// it prints.
#[test]
fn the_kv_cache_is_what_llama_cpp_allocates() {
    // Qwen2.5-0.5B's widths, 4 layers: 14 heads of 64, 2 KV heads.
    let m = info(&llama(4, 896, 4864, 14, 2, 2048, 2));
    let kv = |s: Settings| mib(estimate(&m, &s).kv_cache.unwrap().bytes);
    assert_eq!(kv(settings(4096, 1)), 8.0);
    assert_eq!(kv(settings(4096, 4)), 32.0);
    assert_eq!(kv(settings(300, 1)), 1.0, "300 cells are padded to 512");
    assert_eq!(
        kv(settings(334, 3)),
        3.0,
        "each slot's 334 cells are padded to 512"
    );
    let q8 = Settings {
        cache_type_k: GgmlType::Q8_0,
        cache_type_v: GgmlType::Q8_0,
        ..settings(4096, 1)
    };
    assert_eq!(kv(q8), 4.25);
    let unified = Settings {
        unified_kv: true,
        ..settings(4096, 4)
    };
    assert_eq!(kv(unified), 32.0);
}

#[test]
fn the_compute_buffer_comes_within_what_llama_cpp_prints() {
    let m = info(&llama(4, 896, 4864, 14, 2, 2048, 2));
    let compute = |s: Settings| mib(estimate(&m, &s).compute.unwrap().bytes);
    for (s, measured) in [
        (settings(4096, 1), 41.27),
        (settings(300, 1), 22.13),
        (settings(40000, 1), 76.52),
        (settings(4096, 4), 41.27),
        (
            Settings {
                unified_kv: true,
                ..settings(4096, 4)
            },
            53.27,
        ),
        (
            Settings {
                ubatch: 128,
                ..settings(4096, 1)
            },
            10.32,
        ),
    ] {
        let ours = compute(s);
        assert!(
            (ours - measured).abs() <= 0.01,
            "{s:?}: {ours} vs {measured}"
        );
    }
}

fn gemma3(layers: u32) -> Gguf {
    let (embd, ff, heads, kv_heads, head_dim, vocab) =
        (640u64, 2048u64, 4u32, 1u32, 256u64, 2048u64);
    let mut g = Gguf::new("gemma3")
        .kv("gemma3.context_length", V::U32(32768))
        .kv("gemma3.embedding_length", V::U32(embd as u32))
        .kv("gemma3.feed_forward_length", V::U32(ff as u32))
        .kv("gemma3.block_count", V::U32(layers))
        .kv("gemma3.attention.head_count", V::U32(heads))
        .kv("gemma3.attention.head_count_kv", V::U32(kv_heads))
        .kv("gemma3.attention.key_length", V::U32(head_dim as u32))
        .kv("gemma3.attention.value_length", V::U32(head_dim as u32))
        .kv("gemma3.attention.sliding_window", V::U32(512))
        .tensor("token_embd.weight", &[embd, vocab], 8);
    for i in 0..layers {
        g = g
            .tensor(&format!("blk.{i}.attn_q.weight"), &[embd, head_dim * 4], 8)
            .tensor(&format!("blk.{i}.attn_k.weight"), &[embd, head_dim], 8)
            .tensor(&format!("blk.{i}.ffn_gate.weight"), &[embd, ff], 8)
            .tensor(&format!("blk.{i}.ffn_up.weight"), &[embd, ff], 8)
            .tensor(&format!("blk.{i}.ffn_down.weight"), &[ff, embd], 8);
    }
    g
}

#[test]
fn sliding_window_layers_hold_the_window_and_a_batch() {
    // Gemma 3: five layers of six use a 512-token window.
    let m = info(&gemma3(6));
    let shape = m.shape.as_ref().unwrap();
    assert_eq!(shape.swa_layers, vec![true, true, true, true, true, false]);
    let kv = |s: Settings| estimate(&m, &s).kv_cache.unwrap();
    let one = kv(settings(4096, 1));
    assert_eq!((one.layers, one.swa_layers, one.swa_cells), (1, 5, 1024));
    assert_eq!((mib(one.bytes), mib(one.swa_bytes)), (9.0, 5.0));
    assert_eq!(mib(kv(settings(4096, 4)).bytes), 36.0);
    let unified = kv(Settings {
        unified_kv: true,
        ..settings(4096, 4)
    });
    assert_eq!((unified.swa_cells, mib(unified.bytes)), (2560, 28.5));
    assert_eq!(kv(settings(512, 1)).swa_cells, 512);
    let full = kv(Settings {
        swa_full: true,
        ..settings(4096, 1)
    });
    assert_eq!(mib(full.bytes), 24.0);
    let compute = mib(estimate(&m, &settings(4096, 1)).compute.unwrap().bytes);
    assert!((compute - 23.28).abs() <= 0.01, "{compute}");
}

#[test]
fn a_window_pattern_in_the_file_overrides_the_architecture() {
    let m = info(&gemma3(4).kv(
        "gemma3.attention.sliding_window_pattern",
        V::Bools(vec![true, false, true, false]),
    ));
    assert_eq!(m.shape.unwrap().swa_layers, vec![true, false, true, false]);
}

#[test]
fn an_unknown_architecture_with_a_window_is_counted_at_full_context_and_says_so() {
    let g = llama(2, 256, 512, 4, 4, 512, 1);
    let mut g = Gguf {
        kv: Vec::new(),
        ..g
    };
    for (key, value) in llama(2, 256, 512, 4, 4, 512, 1).kv {
        let key = key.replace("llama", "newarch");
        let value = if key == "general.architecture" {
            V::Str("newarch")
        } else {
            value
        };
        g.kv.push((key, value));
    }
    let m = info(&g.kv("newarch.attention.sliding_window", V::U32(128)));
    assert!(m.shape.as_ref().unwrap().swa_layers.is_empty());
    assert!(m.caveats[0]
        .to_string()
        .contains("newarch has a sliding window"));
}

fn bert(pooling: u32) -> Gguf {
    let (embd, ff, vocab) = (384u64, 1536u64, 2048u64);
    let mut g = Gguf::new("bert")
        .kv("bert.context_length", V::U32(512))
        .kv("bert.embedding_length", V::U32(embd as u32))
        .kv("bert.feed_forward_length", V::U32(ff as u32))
        .kv("bert.block_count", V::U32(4))
        .kv("bert.attention.head_count", V::U32(12))
        .kv("bert.attention.causal", V::Bool(false))
        .kv("bert.pooling_type", V::U32(pooling))
        .tensor("token_embd.weight", &[embd, vocab], 1);
    for i in 0..4 {
        g = g
            .tensor(&format!("blk.{i}.ffn_up.weight"), &[embd, ff], 1)
            .tensor(&format!("blk.{i}.ffn_down.weight"), &[ff, embd], 1);
    }
    g
}

#[test]
fn an_encoder_has_no_kv_cache_and_its_batch_attends_to_itself() {
    let m = info(&bert(1));
    assert_eq!(
        (m.kind, m.cache),
        (ModelKind::Embedding, CacheKind::Cacheless)
    );
    let e = estimate(&m, &settings(512, 1));
    assert_eq!(e.kv_cache.unwrap().bytes, Bytes::ZERO);
    let compute = mib(e.compute.unwrap().bytes);
    assert!((compute - 7.26).abs() <= 0.01, "{compute}");
    assert!(e.is_complete());
}

#[test]
fn a_rank_pooling_is_a_reranker() {
    assert_eq!(info(&bert(4)).kind, ModelKind::Reranking);
    assert_eq!(
        info(&llama(1, 64, 128, 4, 4, 300, 0)).kind,
        ModelKind::Generation
    );
}

#[test]
fn a_missing_key_leaves_the_weights_estimated() {
    let g = Gguf::new("llama")
        .kv("llama.embedding_length", V::U32(64))
        .tensor("token_embd.weight", &[64, 300], 1);
    let e = estimate(&info(&g), &Settings::default());
    assert_eq!(e.weights.bytes, Bytes(64 * 300 * 2));
    assert_eq!(
        e.gaps[0].to_string(),
        "metadata key llama.block_count is missing, so the KV cache and compute buffers are not \
         estimated"
    );
}

#[test]
fn per_layer_kv_heads_skip_layers_without_attention() {
    let m = info(
        &llama(4, 256, 512, 4, 4, 512, 1)
            .kv("llama.attention.head_count_kv", V::U32s(vec![4, 0, 4, 0])),
    );
    let kv = estimate(&m, &settings(1024, 1)).kv_cache.unwrap();
    assert_eq!(kv.layers, 2);
    assert_eq!(kv.bytes, Bytes(2 * 1024 * 2 * 256 * 2));
}

#[test]
fn a_mixture_of_experts_is_estimated_and_says_how_closely() {
    let mut g = llama(4, 1024, 512, 16, 4, 8192, 8)
        .kv("llama.expert_count", V::U32(32))
        .kv("llama.expert_used_count", V::U32(4));
    g.tensors.retain(|t| !t.0.contains("ffn_"));
    for i in 0..4 {
        g = g
            .tensor(
                &format!("blk.{i}.ffn_gate_exps.weight"),
                &[1024, 512, 32],
                12,
            )
            .tensor(&format!("blk.{i}.ffn_up_exps.weight"), &[1024, 512, 32], 12)
            .tensor(
                &format!("blk.{i}.ffn_down_exps.weight"),
                &[512, 1024, 32],
                14,
            );
    }
    let m = info(&g);
    let ffn = m.shape.as_ref().unwrap().ffn;
    assert_eq!(
        ffn.experts.map(|x| (x.count, x.used, x.width)),
        Some((32, 4, 512))
    );
    assert!(ffn.gated);
    assert_eq!(m.caveats, vec![Caveat::MixtureOfExperts]);
    // llama.cpp reported 26.02 MiB for this shape (`moe-32x4` in scripts/bench-estimate).
    let compute = mib(estimate(&m, &settings(4096, 1)).compute.unwrap().bytes);
    assert!((compute / 26.02 - 1.0).abs() < 0.17, "{compute}");
}

#[test]
fn a_fused_gate_and_up_is_a_gated_block_half_as_wide() {
    let mut g = llama(1, 256, 512, 4, 4, 300, 1);
    g.tensors
        .retain(|t| !t.0.contains("ffn_gate") && !t.0.contains("ffn_up"));
    let m = info(&g.tensor("blk.0.ffn_up.weight", &[256, 1024], 1));
    let ffn = m.shape.unwrap().ffn;
    assert_eq!((ffn.width, ffn.gated), (512, true));
}

/// `g` as architecture `arch`: its keys renamed.
fn as_arch(mut g: Gguf, arch: &'static str) -> Gguf {
    let from = match &g.kv[0] {
        (_, V::Str(from)) => *from,
        _ => panic!("the writer puts the architecture first"),
    };
    for (key, value) in std::mem::take(&mut g.kv) {
        let value = if key == "general.architecture" {
            V::Str(arch)
        } else {
            value
        };
        g.kv.push((key.replacen(from, arch, 1), value));
    }
    g
}

/// A Mamba-2 mixer's keys on `g`: a 4-tap convolution, an inner width twice the embedding.
fn ssm(g: Gguf, arch: &str, embd: u32, state: u32, groups: u32, heads: u32) -> Gguf {
    g.kv(&format!("{arch}.ssm.conv_kernel"), V::U32(4))
        .kv(&format!("{arch}.ssm.inner_size"), V::U32(2 * embd))
        .kv(&format!("{arch}.ssm.state_size"), V::U32(state))
        .kv(&format!("{arch}.ssm.time_step_rank"), V::U32(heads))
        .kv(&format!("{arch}.ssm.group_count"), V::U32(groups))
}

/// `mamba2` in scripts/bench-estimate: 4 layers, 512 wide, a state of 64 in 2 groups, 16 heads.
fn mamba2() -> Gguf {
    let mut g = ssm(Gguf::new("mamba2"), "mamba2", 512, 64, 2, 16)
        .kv("mamba2.context_length", V::U32(1_048_576))
        .kv("mamba2.embedding_length", V::U32(512))
        .kv("mamba2.block_count", V::U32(4))
        .kv("tokenizer.ggml.tokens", V::Strs(4096))
        .tensor("token_embd.weight", &[512, 4096], 1)
        .tensor("output.weight", &[512, 4096], 1);
    for i in 0..4 {
        g = g
            .tensor(&format!("blk.{i}.ssm_in.weight"), &[512, 2320], 1)
            .tensor(&format!("blk.{i}.ssm_conv1d.weight"), &[4, 1280], 0)
            .tensor(&format!("blk.{i}.ssm_out.weight"), &[1024, 512], 1);
    }
    g
}

/// `granite-h` in scripts/bench-estimate: Granite 4.0 H's architecture, 6 layers of which the third and
/// the sixth attend (8 heads of 64, 2 KV heads) and the others are Mamba-2 mixers.
fn granite_hybrid() -> Gguf {
    ssm(
        as_arch(llama(6, 512, 1024, 8, 2, 4096, 1), "granitehybrid"),
        "granitehybrid",
        512,
        64,
        1,
        16,
    )
    .kv(
        "granitehybrid.attention.head_count_kv",
        V::U32s(vec![0, 0, 2, 0, 0, 2]),
    )
}

/// The cases below are what llama.cpp (PyPI xllamacpp 2026.10.11549, CPU) reported for the same shapes in
/// scripts/bench-estimate: its `RS buffer size` and `KV buffer size`, to the 0.01 MiB it prints.
#[test]
fn a_mamba_model_s_state_is_its_conv_and_ssm_state_per_layer_per_sequence_not_a_gap() {
    let m = info(&mamba2());
    assert_eq!(m.cache, CacheKind::Recurrent);
    // 3 of the convolution's 4 taps over x, B and C (1024 + 2 × 2 × 64), and a state of 64 per inner channel.
    assert_eq!(
        m.recurrent,
        Some(RecurrentShape {
            layers: 4,
            r_width: 3 * (1024 + 2 * 2 * 64),
            s_width: 64 * 1024,
        })
    );
    let state = |s: Settings| estimate(&m, &s).recurrent.unwrap();
    let one = state(settings(4096, 1));
    assert_eq!((one.cells, one.layers), (1, 4));
    assert_eq!(one.bytes, Bytes(4 * 4 * (3 * 1280 + 65_536)));
    assert_eq!(format!("{:.2}", mib(one.r_bytes)), "0.06");
    assert_eq!(format!("{:.2}", mib(one.s_bytes)), "1.00");
    assert_eq!(format!("{:.2}", mib(one.bytes)), "1.06");
    assert_eq!(
        format!("{:.2}", mib(state(settings(4096, 4)).bytes)),
        "4.23"
    );
    assert_eq!(
        state(settings(1_000_000, 1)),
        one,
        "it does not grow with the context"
    );
    let e = estimate(&m, &settings(4096, 1));
    assert_eq!(e.kv_cache, Some(KvCache::NONE));
    assert_eq!(e.output, Some(Bytes(4096 * 4)));
    assert_eq!(
        e.total(),
        e.weights.bytes + one.bytes + Bytes(4096 * 4),
        "what it knows: the compute buffers are the one gap"
    );
    assert_eq!(
        e.gaps,
        vec![Gap::RecurrentCompute {
            architecture: "mamba2".into()
        }]
    );
    assert_eq!(
        e.gaps[0].to_string(),
        "mamba2 has no attention: its compute buffers are not estimated, their model being measured on \
         attention and feed-forward blocks"
    );
}

#[test]
fn a_mamba_1_layer_reads_no_group_count_and_its_convolution_runs_over_x_alone() {
    let g = Gguf::new("mamba")
        .kv("mamba.block_count", V::U32(2))
        .kv("mamba.ssm.conv_kernel", V::U32(4))
        .kv("mamba.ssm.inner_size", V::U32(1536))
        .kv("mamba.ssm.state_size", V::U32(16))
        .kv("mamba.ssm.group_count", V::U32(8))
        .tensor("token_embd.weight", &[768, 300], 0);
    assert_eq!(
        info(&g).recurrent,
        Some(RecurrentShape {
            layers: 2,
            r_width: 3 * 1536,
            s_width: 16 * 1536,
        })
    );
}

#[test]
fn an_rwkv_model_s_state_is_its_token_shifts_and_wkv_state_per_layer_per_sequence() {
    let g = Gguf::new("rwkv6")
        .kv("rwkv6.block_count", V::U32(24))
        .kv("rwkv6.embedding_length", V::U32(2048))
        .kv("rwkv6.wkv.head_size", V::U32(64))
        .tensor("token_embd.weight", &[2048, 300], 0);
    let m = info(&g);
    // Two token shifts (llama.cpp's default) of the embedding, and a head-sized state per channel.
    assert_eq!(
        m.recurrent,
        Some(RecurrentShape {
            layers: 24,
            r_width: 2 * 2048,
            s_width: 2048 * 64,
        })
    );
    let e = estimate(&m, &settings(8192, 3));
    assert_eq!(
        e.recurrent.unwrap().bytes,
        Bytes(3 * 24 * (2 * 2048 + 2048 * 64) * 4)
    );
    let one_shift = info(&as_arch(g, "rwkv7").kv("rwkv7.token_shift_count", V::U32(1)));
    assert_eq!(one_shift.recurrent.unwrap().r_width, 2048);
}

#[test]
fn each_family_s_state_is_sized_as_llama_cpp_sizes_it() {
    // LFM2: a short convolution keeps its last l_cache - 1 inputs, and no state proper.
    let lfm2 = as_arch(llama(4, 1024, 2048, 16, 8, 300, 1), "lfm2")
        .kv("lfm2.shortconv.l_cache", V::U32(3))
        .kv("lfm2.attention.head_count_kv", V::U32s(vec![0, 0, 8, 0]));
    assert_eq!(
        info(&lfm2).recurrent,
        Some(RecurrentShape {
            layers: 3,
            r_width: 1024 * 2,
            s_width: 0,
        })
    );
    // Kimi's delta attention: three convolutions over the heads' width, one head_dim² state per head.
    let kimi = as_arch(llama(4, 1024, 2048, 32, 32, 300, 1), "kimi-linear")
        .kv("kimi-linear.ssm.conv_kernel", V::U32(4))
        .kv("kimi-linear.kda.head_dim", V::U32(128))
        .kv(
            "kimi-linear.attention.head_count_kv",
            V::U32s(vec![0, 0, 0, 32]),
        );
    assert_eq!(
        info(&kimi).recurrent,
        Some(RecurrentShape {
            layers: 3,
            r_width: 3 * 3 * 32 * 128,
            s_width: 128 * 128 * 32,
        })
    );
}

#[test]
fn a_hybrid_s_kv_cache_counts_its_attention_layers_alone_and_its_state_its_recurrent_layers_alone()
{
    let m = info(&granite_hybrid());
    assert_eq!(m.cache, CacheKind::Hybrid);
    assert_eq!(m.recurrent.map(|r| r.layers), Some(4));
    let e = estimate(&m, &settings(4096, 1));
    let (kv, state) = (e.kv_cache.unwrap(), e.recurrent.unwrap());
    assert_eq!((kv.layers, state.layers), (2, 4));
    assert_eq!(mib(kv.bytes), 4.0);
    assert_eq!(state.bytes, Bytes(4 * 4 * (3 * 1152 + 65_536)));
    assert_eq!(format!("{:.2}", mib(state.bytes)), "1.05");
    let four = estimate(&m, &settings(4096, 4));
    assert_eq!(mib(four.kv_cache.unwrap().bytes), 16.0);
    assert_eq!(format!("{:.2}", mib(four.recurrent.unwrap().bytes)), "4.21");
    // Estimated whole, with the compute buffer's shortfall said.
    assert!(e.is_complete(), "{:?}", e.gaps);
    assert!(e.caveats.contains(&Caveat::RecurrentCompute));
    assert_eq!(e.total(), e.beside_cache() + kv.bytes);
    assert!(e.beside_cache() >= e.weights.bytes + state.bytes);
}

#[test]
fn qwen3_next_attends_in_every_fourth_layer_unless_its_file_lists_its_recurrent_layers() {
    let qwen = |g: Gguf| info(&ssm(as_arch(g, "qwen3next"), "qwen3next", 256, 128, 2, 32));
    let layers = |m: &ModelInfo| {
        (
            estimate(m, &settings(1024, 1)).kv_cache.unwrap().layers,
            m.recurrent.unwrap().layers,
        )
    };
    // No interval stated: llama.cpp's default of 4.
    let m = qwen(llama(8, 256, 512, 4, 4, 300, 1));
    assert_eq!(layers(&m), (2, 6));
    assert!(estimate(&m, &settings(1024, 1)).is_complete());
    let every_other =
        qwen(llama(8, 256, 512, 4, 4, 300, 1).kv("llama.full_attention_interval", V::U32(2)));
    assert_eq!(layers(&every_other), (4, 4));
    let listed = qwen(llama(8, 256, 512, 4, 4, 300, 1).kv(
        "llama.attention.recurrent_layers",
        V::Bools(vec![true, false, true, true, true, true, true, false]),
    ));
    assert_eq!(layers(&listed), (2, 6));
    assert!(!listed.shape.unwrap().has_kv(2));
    // The layers appended for multi-token prediction keep no recurrent state.
    let mtp = qwen(llama(8, 256, 512, 4, 4, 300, 1).kv("llama.nextn_predict_layers", V::U32(1)));
    assert_eq!(mtp.recurrent.unwrap().layers, 6);
    let mtp = qwen(llama(9, 256, 512, 4, 4, 300, 1).kv("llama.nextn_predict_layers", V::U32(1)));
    assert_eq!(mtp.recurrent.unwrap().layers, 6);
}

#[test]
fn nemotron_h_s_feed_forward_layers_keep_neither_a_cache_nor_a_state_and_falcon_h1_s_keep_both() {
    let nemotron = ssm(
        as_arch(llama(4, 256, 512, 4, 2, 300, 1), "nemotron_h"),
        "nemotron_h",
        256,
        64,
        1,
        8,
    )
    .kv(
        "nemotron_h.attention.head_count_kv",
        V::U32s(vec![0, 0, 2, 0]),
    )
    .kv(
        "nemotron_h.feed_forward_length",
        V::U32s(vec![0, 0, 0, 512]),
    );
    let m = info(&nemotron);
    let e = estimate(&m, &settings(1024, 1));
    assert_eq!(
        (e.kv_cache.unwrap().layers, e.recurrent.unwrap().layers),
        (1, 2)
    );
    let falcon = ssm(
        as_arch(llama(4, 256, 512, 4, 2, 300, 1), "falcon-h1"),
        "falcon-h1",
        256,
        64,
        1,
        8,
    );
    let e = estimate(&info(&falcon), &settings(1024, 1));
    assert_eq!(
        (e.kv_cache.unwrap().layers, e.recurrent.unwrap().layers),
        (4, 4)
    );
}

#[test]
fn a_state_the_file_lacks_a_key_for_stays_a_gap_that_names_the_key() {
    let mut g = mamba2();
    g.kv.retain(|(k, _)| k != "mamba2.ssm.group_count");
    let m = info(&g);
    assert_eq!(m.recurrent, None);
    let e = estimate(&m, &settings(4096, 1));
    assert_eq!(e.recurrent, None);
    assert_eq!(e.weights.bytes, Bytes(g.table_bytes()));
    assert_eq!(
        e.gaps[0].to_string(),
        "mamba2 keeps a recurrent state per slot instead of a KV cache, which is not estimated: metadata \
         key mamba2.ssm.group_count is missing"
    );
    // A hybrid's KV cache is still estimated beside it.
    let mut g = granite_hybrid();
    g.kv.retain(|(k, _)| k != "granitehybrid.ssm.state_size");
    let e = estimate(&info(&g), &settings(4096, 1));
    assert_eq!(mib(e.kv_cache.unwrap().bytes), 4.0);
    assert_eq!(
        e.gaps[0].to_string(),
        "granitehybrid keeps a recurrent state per slot in its recurrent layers, which is not \
         estimated: metadata key granitehybrid.ssm.state_size is missing"
    );
    // An architecture whose state is not sized here says so.
    let e = estimate(
        &info(&as_arch(llama(2, 256, 512, 4, 4, 300, 1), "minimax-01")),
        &settings(4096, 1),
    );
    assert!(e.recurrent.is_none());
    assert!(e.gaps[0]
        .to_string()
        .ends_with("which is not estimated: how this architecture sizes it is not known here"));
}

#[test]
fn no_context_chosen_means_the_models_own() {
    let m = info(&llama(1, 64, 128, 4, 4, 300, 0));
    let e = estimate(&m, &Settings::default());
    assert_eq!(
        (e.assumed.context, e.assumed.context_from_model),
        (4096, true)
    );
    let e = estimate(&m, &settings(1000, 3));
    assert_eq!(
        (e.assumed.ctx_size, e.assumed.context_from_model),
        (3000, false)
    );
}

#[test]
fn chosen_settings_take_llama_cpps_cache_types_and_refuse_the_rest() {
    let s = Settings::chosen(Some(8192), 4, "Q8_0").unwrap();
    assert_eq!(
        (s.context, s.slots, s.cache_type_k, s.cache_type_v),
        (Some(8192), 4, GgmlType::Q8_0, GgmlType::Q8_0)
    );
    assert_eq!(Settings::chosen(Some(0), 1, "f16").unwrap().context, None);
    assert_eq!(
        Settings::chosen(None, 0, "f16"),
        Err(SettingsError::Slots(0))
    );
    assert!(matches!(
        Settings::chosen(None, 1, "q4_K"),
        Err(SettingsError::CacheType(_))
    ));
}

#[test]
fn a_cache_type_that_does_not_divide_the_rows_is_a_gap() {
    // 3 KV heads of 20: rows of 60, not whole q8_0 blocks of 32.
    let m = info(&llama(1, 80, 128, 4, 3, 300, 0));
    let e = estimate(
        &m,
        &Settings {
            cache_type_k: GgmlType::Q8_0,
            ..settings(512, 1)
        },
    );
    assert!(e.kv_cache.is_none());
    assert!(e.gaps[0]
        .to_string()
        .contains("not whole blocks of q8_0/f16"));
}

#[test]
fn an_estimate_serializes_for_the_api() {
    let e = estimate(&info(&gemma3(6)), &settings(4096, 2));
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["assumed"]["cache_type_k"], "f16");
    assert_eq!(json["kv_cache"]["streams"], 2);
    let back: Estimate = serde_json::from_value(json).unwrap();
    assert_eq!(back, e);
}

proptest! {
    #[test]
    fn the_estimate_grows_with_context_and_slots(
        layers in 1u32..6,
        embd_heads in 1u64..8,
        kv_div in 0u32..3,
        ff_mul in 1u64..6,
        context in 1u32..70_000,
        more_context in 0u32..20_000,
        slots in 1u32..9,
        more_slots in 0u32..4,
        unified: bool,
        gemma: bool,
    ) {
        let heads = embd_heads as u32 * 4;
        let m = if gemma {
            info(&gemma3(layers))
        } else {
            info(&llama(layers, embd_heads * 256, embd_heads * 256 * ff_mul, heads, heads >> kv_div, 1000, 1))
        };
        let at = |context, slots| {
            estimate(&m, &Settings { unified_kv: unified, ..settings(context, slots) })
        };
        let base = at(context, slots);
        for bigger in [at(context + more_context, slots), at(context, slots + more_slots)] {
            prop_assert!(bigger.total() >= base.total());
            prop_assert!(bigger.kv_cache.unwrap().bytes >= base.kv_cache.unwrap().bytes);
            prop_assert!(bigger.compute.unwrap().bytes >= base.compute.unwrap().bytes);
        }
    }

    #[test]
    fn weights_always_equal_the_sum_of_the_tensor_table(
        tensors in proptest::collection::vec(
            (prop_oneof![Just(0u32), Just(1), Just(2), Just(8), Just(12), Just(14), Just(30)],
             1u64..5, 1u64..40, 1u64..3),
            1..40,
        ),
    ) {
        let mut g = Gguf::new("llama");
        for (i, &(type_id, blocks, rows, planes)) in tensors.iter().enumerate() {
            let row = blocks * block(type_id).1;
            let name = if i % 3 == 0 { format!("t{i}.weight") } else { format!("blk.{}.t{i}.weight", i % 5) };
            g = g.tensor(&name, &[row, rows, planes], type_id);
        }
        let m = info(&g);
        prop_assert_eq!(m.weights.bytes, Bytes(g.table_bytes()));
        prop_assert!(m.weights.exact);
        let by_type: Bytes = m.weights.by_type.iter().map(|t| t.bytes).sum();
        prop_assert_eq!(by_type, m.weights.bytes);
    }
}
