"""The memory estimate against llama.cpp itself (BENCHMARKS.md, "The memory estimate against llama.cpp"); run by
scripts/bench-estimate.

Writes random-weight GGUF models of varied shape with PyPI's gguf, starts llama.cpp's own server (PyPI's xllamacpp,
CPU, one thread, bound to 127.0.0.1) on each at several contexts and slot counts, reads what its log says it allocated
(the model, KV, recurrent state (RS), compute and output buffer lines) and compares each part with what Tessera's
estimate (placement/examples/estimate.rs) prints for the same file.

A case whose estimate leaves a part out (a gap) or says it undercounts one (a recurrent model's compute buffer) is
shown, and held to no target.

    python bench-estimate.py --estimate PATH/TO/estimate [--keep DIR]

The server is stopped as soon as it is listening: allocation is done by then, and nothing is ever asked of it.
CPU_REPACK (the CPU backend's interleaved copy of some quantized weights, which no GPU makes) is switched off with
no_extra_bufts, so that the model buffer is the weights once, as on a GPU.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

MiB = 1 << 20


def serve(args):
    """Child mode: load a model with the given settings and wait to be killed."""
    import xllamacpp

    a = json.loads(args)
    p = xllamacpp.CommonParams()
    p.model.path = a["model"]
    p.hostnames = ["127.0.0.1"]
    p.port = 0
    p.n_ctx = a["ctx_size"]
    p.n_parallel = a["slots"]
    p.kv_unified = a.get("unified", False)
    p.embedding = a.get("embedding", False)
    if "cache_type" in a:
        t = getattr(xllamacpp.ggml_type, "GGML_TYPE_" + a["cache_type"].upper())
        p.cache_type_k = t
        p.cache_type_v = t
    p.no_extra_bufts = True
    p.fit_params = False
    p.warmup = False
    p.cpuparams.n_threads = 1
    p.verbosity = 4
    server = xllamacpp.Server(p)
    time.sleep(3600)
    del server


# --- models ---------------------------------------------------------------------------------------------------------


def writer_for(path, arch, ctx_train):
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(ctx_train)
    return w


def vocab(w, n_vocab, model="llama"):
    import gguf

    specials = [b"<unk>", b"<s>", b"</s>", b"<pad>"]
    tokens = specials + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"tok{i}".encode() for i in range(n_vocab - len(tokens))]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (n_vocab - len(types))
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(3)


def quantizable(q):
    """Whether gguf can quantize to `q` (it can only read some types, such as the K-quants)."""
    import gguf
    import numpy as np

    try:
        gguf.quants.quantize(np.zeros((1, 256), dtype=np.float32), q)
        return True
    except NotImplementedError:
        return False


class Weights:
    """Adds tensors: random normal values, quantized by gguf where it can; random blocks where it cannot (K-quants)."""

    def __init__(self, w, seed):
        import numpy as np

        self.w = w
        self.np = np
        self.rng = np.random.default_rng(seed)

    def add(self, name, rows, cols, qtype, experts=None):
        """A matrix of `rows` rows of `cols`, or `experts` of them stacked."""
        import gguf

        np = self.np
        Q = gguf.GGMLQuantizationType
        shape = (rows, cols) if experts is None else (experts, rows, cols)
        if qtype in ("F32", "F16"):
            a = self.rng.standard_normal(shape, dtype=np.float32) * 0.02
            self.w.add_tensor(name, a if qtype == "F32" else a.astype(np.float16))
            return
        q = Q[qtype]
        if quantizable(q):
            data = gguf.quants.quantize(self.rng.standard_normal(shape, dtype=np.float32) * 0.02, q)
        else:
            blk, size = gguf.GGML_QUANT_SIZES[q]
            data = self.rng.integers(0, 256, size=shape[:-1] + (cols // blk * size,), dtype=np.uint8)
        self.w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=q)

    def norm(self, name, n):
        self.w.add_tensor(name, self.np.ones(n, dtype=self.np.float32))

    def bias(self, name, n):
        self.w.add_tensor(name, self.np.zeros(n, dtype=self.np.float32))


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama(path, layers, embd, heads, kv_heads, ff, n_vocab, types, head_dim=None, tied=False, experts=None, seed=0):
    """A llama-architecture decoder. `types` maps a tensor kind (attn, ffn, ffn_down, embd) to its ggml type;
    `experts` = (count, used) makes each feed-forward block a mixture of that many experts `ff` wide."""
    head_dim = head_dim or embd // heads
    w = writer_for(path, "llama", 131072)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    if experts:
        w.add_expert_count(experts[0])
        w.add_expert_used_count(experts[1])
    vocab(w, n_vocab)
    t = Weights(w, seed)
    t.add("token_embd.weight", n_vocab, embd, types["embd"])
    t.norm("output_norm.weight", embd)
    if not tied:
        t.add("output.weight", n_vocab, embd, types["embd"])
    for i in range(layers):
        t.norm(f"blk.{i}.attn_norm.weight", embd)
        t.add(f"blk.{i}.attn_q.weight", heads * head_dim, embd, types["attn"])
        t.add(f"blk.{i}.attn_k.weight", kv_heads * head_dim, embd, types["attn"])
        t.add(f"blk.{i}.attn_v.weight", kv_heads * head_dim, embd, types["attn"])
        t.add(f"blk.{i}.attn_output.weight", embd, heads * head_dim, types["attn"])
        t.norm(f"blk.{i}.ffn_norm.weight", embd)
        down = types.get("ffn_down", types["ffn"])
        if experts:
            t.add(f"blk.{i}.ffn_gate_inp.weight", experts[0], embd, "F32")
            t.add(f"blk.{i}.ffn_gate_exps.weight", ff, embd, types["ffn"], experts=experts[0])
            t.add(f"blk.{i}.ffn_up_exps.weight", ff, embd, types["ffn"], experts=experts[0])
            t.add(f"blk.{i}.ffn_down_exps.weight", embd, ff, down, experts=experts[0])
        else:
            t.add(f"blk.{i}.ffn_gate.weight", ff, embd, types["ffn"])
            t.add(f"blk.{i}.ffn_up.weight", ff, embd, types["ffn"])
            t.add(f"blk.{i}.ffn_down.weight", embd, ff, down)
    finish(w)


def gemma3(path, layers, embd, heads, kv_heads, head_dim, ff, n_vocab, window, qtype, seed=0):
    """Gemma 3: five of every six layers attend through a sliding window; tied embeddings."""
    w = writer_for(path, "gemma3", 131072)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(window)
    w.add_rope_freq_base(1e6)
    vocab(w, n_vocab)
    t = Weights(w, seed)
    t.add("token_embd.weight", n_vocab, embd, qtype)
    t.norm("output_norm.weight", embd)
    for i in range(layers):
        t.norm(f"blk.{i}.attn_norm.weight", embd)
        t.add(f"blk.{i}.attn_q.weight", heads * head_dim, embd, qtype)
        t.add(f"blk.{i}.attn_k.weight", kv_heads * head_dim, embd, qtype)
        t.add(f"blk.{i}.attn_v.weight", kv_heads * head_dim, embd, qtype)
        t.add(f"blk.{i}.attn_output.weight", embd, heads * head_dim, qtype)
        t.norm(f"blk.{i}.attn_q_norm.weight", head_dim)
        t.norm(f"blk.{i}.attn_k_norm.weight", head_dim)
        t.norm(f"blk.{i}.post_attention_norm.weight", embd)
        t.norm(f"blk.{i}.ffn_norm.weight", embd)
        t.add(f"blk.{i}.ffn_gate.weight", ff, embd, qtype)
        t.add(f"blk.{i}.ffn_up.weight", ff, embd, qtype)
        t.add(f"blk.{i}.ffn_down.weight", embd, ff, qtype)
        t.norm(f"blk.{i}.post_ffw_norm.weight", embd)
    finish(w)


def bert(path, layers, embd, heads, ff, n_vocab, qtype, seed=0):
    """A BERT encoder with mean pooling: an embedding model, no KV cache."""
    import gguf

    w = writer_for(path, "bert", 512)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(n_vocab - 5)]
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * 5 + [gguf.TokenType.NORMAL] * (n_vocab - 5))
    w.add_token_type_count(2)
    w.add_unk_token_id(1)
    w.add_bos_token_id(2)
    w.add_sep_token_id(3)
    w.add_pad_token_id(0)
    w.add_mask_token_id(4)
    t = Weights(w, seed)
    t.add("token_embd.weight", n_vocab, embd, qtype)
    t.add("token_types.weight", 2, embd, "F32")
    t.add("position_embd.weight", 512, embd, qtype)
    t.norm("token_embd_norm.weight", embd)
    t.bias("token_embd_norm.bias", embd)
    for i in range(layers):
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output"):
            t.add(f"blk.{i}.{kind}.weight", embd, embd, qtype)
            t.bias(f"blk.{i}.{kind}.bias", embd)
        t.norm(f"blk.{i}.attn_output_norm.weight", embd)
        t.bias(f"blk.{i}.attn_output_norm.bias", embd)
        t.add(f"blk.{i}.ffn_up.weight", ff, embd, qtype)
        t.bias(f"blk.{i}.ffn_up.bias", ff)
        t.add(f"blk.{i}.ffn_down.weight", embd, ff, qtype)
        t.bias(f"blk.{i}.ffn_down.bias", embd)
        t.norm(f"blk.{i}.layer_output_norm.weight", embd)
        t.bias(f"blk.{i}.layer_output_norm.bias", embd)
    finish(w)


def ssm_layer(t, i, embd, d_conv, d_inner, d_state, n_group, n_head, qtype):
    """A Mamba-2 mixer as llama.cpp loads it (mamba2's and granitehybrid's load_arch_tensors): the in-projection
    makes z, x, B, C and dt at once; the 1-D convolution runs over x, B and C."""
    conv_dim = d_inner + 2 * n_group * d_state
    t.add(f"blk.{i}.ssm_in.weight", d_inner + conv_dim + n_head, embd, qtype)
    t.add(f"blk.{i}.ssm_conv1d.weight", conv_dim, d_conv, "F32")
    t.bias(f"blk.{i}.ssm_conv1d.bias", conv_dim)
    t.bias(f"blk.{i}.ssm_dt.bias", n_head)
    t.add(f"blk.{i}.ssm_a", n_head, 1, "F32")
    t.add(f"blk.{i}.ssm_d", n_head, 1, "F32")
    t.add(f"blk.{i}.ssm_norm.weight", n_group, d_inner // n_group, "F32")
    t.add(f"blk.{i}.ssm_out.weight", embd, d_inner, qtype)


def ssm_keys(w, d_conv, d_inner, d_state, n_group, n_head):
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_head)
    w.add_ssm_group_count(n_group)


def mamba2(path, layers, embd, d_state, n_group, n_head, n_vocab, qtype, d_conv=4, seed=0):
    """Mamba-2: every layer a recurrent mixer, no attention, no feed-forward block; the inner width twice the
    embedding."""
    w = writer_for(path, "mamba2", 1048576)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_layer_norm_rms_eps(1e-5)
    ssm_keys(w, d_conv, 2 * embd, d_state, n_group, n_head)
    vocab(w, n_vocab)
    t = Weights(w, seed)
    t.add("token_embd.weight", n_vocab, embd, qtype)
    t.norm("output_norm.weight", embd)
    t.add("output.weight", n_vocab, embd, qtype)
    for i in range(layers):
        t.norm(f"blk.{i}.attn_norm.weight", embd)
        ssm_layer(t, i, embd, d_conv, 2 * embd, d_state, n_group, n_head, qtype)
    finish(w)


def granite_hybrid(path, attention, embd, heads, kv_heads, ff, d_state, n_group, n_head, n_vocab, qtype, d_conv=4,
                   seed=0):
    """Granite 4.0 H (granitehybrid): Mamba-2 layers and attention layers (`attention` says which), each with a
    gated feed-forward block; a layer is recurrent where its KV head count is 0."""
    layers = len(attention)
    w = writer_for(path, "granitehybrid", 131072)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv([kv_heads if a else 0 for a in attention])
    w.add_layer_norm_rms_eps(1e-5)
    ssm_keys(w, d_conv, 2 * embd, d_state, n_group, n_head)
    vocab(w, n_vocab)
    t = Weights(w, seed)
    head_dim = embd // heads
    t.add("token_embd.weight", n_vocab, embd, qtype)
    t.norm("output_norm.weight", embd)
    t.add("output.weight", n_vocab, embd, qtype)
    for i, a in enumerate(attention):
        t.norm(f"blk.{i}.attn_norm.weight", embd)
        if a:
            t.add(f"blk.{i}.attn_q.weight", embd, embd, qtype)
            t.add(f"blk.{i}.attn_k.weight", kv_heads * head_dim, embd, qtype)
            t.add(f"blk.{i}.attn_v.weight", kv_heads * head_dim, embd, qtype)
            t.add(f"blk.{i}.attn_output.weight", embd, embd, qtype)
        else:
            ssm_layer(t, i, embd, d_conv, 2 * embd, d_state, n_group, n_head, qtype)
        t.norm(f"blk.{i}.ffn_norm.weight", embd)
        t.add(f"blk.{i}.ffn_gate.weight", ff, embd, qtype)
        t.add(f"blk.{i}.ffn_up.weight", ff, embd, qtype)
        t.add(f"blk.{i}.ffn_down.weight", embd, ff, qtype)
    finish(w)


def uniform(t):
    return {"embd": t, "attn": t, "ffn": t}


# name, description, writer, its arguments, and the runs: (each slot's context, slots, extra settings)
MODELS = [
    ("mha-f32", "llama, 12 layers, 384 wide, 6 heads (no GQA), F32", llama,
     dict(layers=12, embd=384, heads=6, kv_heads=6, ff=1024, n_vocab=4096, types=uniform("F32")),
     [(512, 1, {}), (4096, 1, {}), (2048, 4, {})]),
    ("gqa4-f16", "llama, 8 layers, 1024 wide, 16 heads, 4 KV heads, F16", llama,
     dict(layers=8, embd=1024, heads=16, kv_heads=4, ff=2816, n_vocab=8192, types=uniform("F16")),
     [(4096, 1, {}), (8192, 4, {}), (4096, 8, {"cache_type": "q8_0"}), (2048, 4, {"unified": True})]),
    ("qwen05-q8", "llama with Qwen2.5-0.5B's widths, 6 layers, 14 heads, 2 KV heads, Q8_0, tied embeddings", llama,
     dict(layers=6, embd=896, heads=14, kv_heads=2, ff=4864, n_vocab=16384, types=uniform("Q8_0"), tied=True),
     [(1000, 1, {}), (32768, 1, {}), (131072, 1, {}), (8192, 3, {"cache_type": "q4_0"})]),
    ("gqa8-q4", "llama, 4 layers, 2048 wide, 32 heads, 4 KV heads, Q4_0 (embeddings Q8_0)", llama,
     dict(layers=4, embd=2048, heads=32, kv_heads=4, ff=5632, n_vocab=32000,
          types={"embd": "Q8_0", "attn": "Q4_0", "ffn": "Q4_0"}),
     [(4096, 1, {}), (16384, 2, {}), (4096, 16, {})]),
    ("legacy-mix", "llama, 6 layers, 768 wide, 12 heads, 3 KV heads: Q5_0, Q5_1, Q4_1, BF16", llama,
     dict(layers=6, embd=768, heads=12, kv_heads=3, ff=2048, n_vocab=8192,
          types={"embd": "BF16", "attn": "Q5_1", "ffn": "Q5_0", "ffn_down": "Q4_1"}),
     [(2048, 1, {}), (8192, 2, {"cache_type": "q8_0"})]),
    ("kquant-mix", "llama with Qwen2.5-1.5B's widths, 3 layers, 128-wide heads: Q4_K, Q6_K, TQ2_0 (random blocks)",
     llama,
     dict(layers=3, embd=1536, heads=12, kv_heads=2, ff=8960, n_vocab=16384, head_dim=128,
          types={"embd": "Q6_K", "attn": "Q4_K", "ffn": "TQ2_0", "ffn_down": "Q6_K"}),
     [(4096, 1, {}), (32768, 2, {})]),
    ("gemma3-swa", "gemma3, 12 layers (10 with a 1024-token window), 1152 wide, 4 heads of 256, 1 KV head, Q8_0",
     gemma3,
     dict(layers=12, embd=1152, heads=4, kv_heads=1, head_dim=256, ff=6912, n_vocab=16384, window=1024, qtype="Q8_0"),
     [(4096, 1, {}), (32768, 1, {}), (8192, 4, {}), (8192, 4, {"unified": True})]),
    ("moe-32x4", "llama, 4 layers, 1024 wide, a mixture of 32 experts 512 wide, 4 per token: Q4_K (random blocks)",
     llama,
     dict(layers=4, embd=1024, heads=16, kv_heads=4, ff=512, n_vocab=8192, experts=(32, 4),
          types={"embd": "Q8_0", "attn": "Q8_0", "ffn": "Q4_K", "ffn_down": "Q6_K"}),
     [(4096, 1, {}), (16384, 4, {})]),
    ("moe-16x8", "llama, 3 layers, 2048 wide, a mixture of 16 experts 256 wide, 8 per token: Q8_0", llama,
     dict(layers=3, embd=2048, heads=32, kv_heads=8, ff=256, n_vocab=8192, experts=(16, 8), types=uniform("Q8_0")),
     [(4096, 1, {})]),
    ("bert-embed", "bert, 6 layers, 768 wide, 12 heads, F16, mean pooling (embedding model, no KV cache)", bert,
     dict(layers=6, embd=768, heads=12, ff=3072, n_vocab=8192, qtype="F16"),
     [(512, 1, {"embedding": True}), (512, 4, {"embedding": True})]),
    ("mamba2", "mamba2, 4 layers, 512 wide, a state of 64 in 2 groups, 16 heads, F16 (no attention: a recurrent "
     "state, no KV cache)", mamba2,
     dict(layers=4, embd=512, d_state=64, n_group=2, n_head=16, n_vocab=4096, qtype="F16"),
     [(4096, 1, {}), (4096, 4, {})]),
    ("granite-h", "granitehybrid, 6 layers: 2 attend (8 heads, 2 KV heads), 4 are Mamba-2 mixers (a state of 64), "
     "512 wide, F16", granite_hybrid,
     dict(attention=[False, False, True, False, False, True], embd=512, heads=8, kv_heads=2, ff=1024, d_state=64,
          n_group=1, n_head=16, n_vocab=4096, qtype="F16"),
     [(4096, 1, {}), (4096, 4, {}), (32768, 2, {})]),
    ("granite-h-wide", "granitehybrid, 8 layers: 2 attend (16 heads, 4 KV heads), 6 are Mamba-2 mixers (a state of "
     "128), 1024 wide, Q8_0", granite_hybrid,
     dict(attention=[False, False, False, True, False, False, False, True], embd=1024, heads=16, kv_heads=4,
          ff=2816, d_state=128, n_group=1, n_head=32, n_vocab=16384, qtype="Q8_0"),
     [(4096, 1, {}), (16384, 4, {})]),
]


# --- measuring ------------------------------------------------------------------------------------------------------

PARTS = {
    "weights": re.compile(r"(\S+) model buffer size = +([\d.]+) MiB"),
    "kv": re.compile(r"(\S+) KV buffer size = +([\d.]+) MiB"),
    "recurrent": re.compile(r"(\S+) RS buffer size = +([\d.]+) MiB"),
    "compute": re.compile(r"(\S+) compute buffer size = +([\d.]+) MiB"),
    "output": re.compile(r"(\S+) +output buffer size = +([\d.]+) MiB"),
}


def llama_cpp(model, context, slots, extra, timeout=120):
    """What llama.cpp reports it allocated, in MiB per part, and its log."""
    run = dict(model=model, ctx_size=context * slots, slots=slots, **extra)
    child = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(run)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(timeout, child.kill)
    timer.start()
    lines = []
    try:
        for line in child.stdout:
            lines.append(line)
            if "listening on" in line or "exiting due to" in line:
                break
    finally:
        child.kill()
        child.wait()
        timer.cancel()
    log = "".join(lines)
    if "listening on" not in log:
        raise RuntimeError(f"llama.cpp did not start on {model} {run}:\n" + log[-3000:])
    return {part: sum(float(m[2]) for m in rx.finditer(log)) for part, rx in PARTS.items()}, log


def tessera(estimate, model, context, slots, extra):
    cmd = [estimate, model, "--context", str(context), "--slots", str(slots)]
    if "cache_type" in extra:
        cmd += ["--cache-type", extra["cache_type"]]
    if extra.get("unified"):
        cmd.append("--unified")
    e = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    part = lambda p: (p or {}).get("bytes", 0) / MiB
    return {
        "weights": e["weights"]["bytes"] / MiB,
        "kv": part(e["kv_cache"]),
        "recurrent": part(e["recurrent"]),
        "compute": part(e["compute"]),
        "output": (e["output"] or 0) / MiB,
    }, e


def err(ours, theirs):
    if theirs == 0:
        return 0.0 if ours == 0 else float("inf")
    return (ours - theirs) / theirs * 100


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--estimate", help="the estimate example's binary")
    ap.add_argument("--keep", help="write the models here and keep them")
    ap.add_argument("--serve")
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve)
    if not args.estimate:
        ap.error("--estimate is required")

    started = time.time()
    workdir = args.keep or tempfile.mkdtemp(prefix="bench-estimate-")
    os.makedirs(workdir, exist_ok=True)
    rows = []
    print("| case | context × slots | weights, MiB: ours / llama.cpp | KV cache | recurrent state | compute | output | "
          "total | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    try:
        for name, description, write, kwargs, runs in MODELS:
            path = os.path.join(workdir, name + ".gguf")
            write(path, **kwargs)
            print(f"| **{name}**: {description} | | | | | | | | |", flush=True)
            for context, slots, extra in runs:
                theirs, _ = llama_cpp(path, context, slots, extra)
                ours, e = tessera(args.estimate, path, context, slots, extra)
                total_ours, total_theirs = sum(ours.values()), sum(theirs.values())
                label = f"{context} × {slots}" + "".join(
                    f", {k} {v}" if v is not True else f", {k}" for k, v in extra.items() if k != "embedding")
                cells = [f"{ours[p]:.2f} / {theirs[p]:.2f} ({err(ours[p], theirs[p]):+.1f} %)"
                         for p in PARTS]
                total_err = err(total_ours, total_theirs)
                held = not e["gaps"] and not any(c["caveat"] == "recurrent_compute" for c in e["caveats"])
                print(f"| {name} | {label} | " + " | ".join(cells) +
                      f" | {total_ours:.2f} / {total_theirs:.2f} MiB | **{total_err:+.2f} %**"
                      + ("" if held else " (not held: " + (e["gap_texts"][0] if e["gaps"] else
                                                            "its compute buffer undercounted, a hybrid's") + ")")
                      + " |", flush=True)
                rows.append((name, label, ours, theirs, total_err, e, held))
    finally:
        if not args.keep:
            for f in os.listdir(workdir):
                os.remove(os.path.join(workdir, f))
            os.rmdir(workdir)

    print()
    loose = [r for r in rows if not r[6]]
    if loose:
        print(f"{len(loose)} case(s) with a part left out or undercounted by the estimate's own say, held to no "
              f"target: " + ", ".join(f"{r[0]} at {r[1]} {r[4]:+.2f} %" for r in loose))
    held = [r for r in rows if r[6]]
    worst = max(held, key=lambda r: abs(r[4]))
    print(f"{len(held)} cases held in {time.time() - started:.0f} s; worst total: {worst[0]} at {worst[1]}, "
          f"{worst[4]:+.2f} %")
    for part in PARTS:
        # Parts under 1 MiB are shown by llama.cpp to 0.01 MiB: their percentages say more about its rounding. A
        # case not held still measures its other parts.
        big = [r for r in (held if part == "compute" else rows) if r[3][part] >= 1]
        if big:
            w = max(big, key=lambda r: abs(err(r[2][part], r[3][part])))
            print(f"worst {part} (of parts of 1 MiB or more): {w[0]} at {w[1]}, "
                  f"{err(w[2][part], w[3][part]):+.2f} %")
    outside = [r for r in held if abs(r[4]) > 5]
    if outside:
        print(f"{len(outside)} case(s) outside ±5 % in total")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
