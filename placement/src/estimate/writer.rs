//! A tiny GGUF writer for tests: a header with chosen metadata and tensor table, written by hand so that
//! the reader is checked against bytes it did not make. Shared with the server's tests (feature `testing`),
//! which put a model file on disk for the estimate's endpoint.

/// Bytes per block and elements per block of the types these tests write, as gguf-py's
/// `GGML_QUANT_SIZES` lists them: an oracle apart from the crate's own table.
pub fn block(type_id: u32) -> (u64, u64) {
    match type_id {
        0 => (4, 1),      // f32
        1 => (2, 1),      // f16
        2 => (18, 32),    // q4_0
        8 => (34, 32),    // q8_0
        12 => (144, 256), // q4_K
        14 => (210, 256), // q6_K
        30 => (2, 1),     // bf16
        _ => panic!("the test writer has no size for type {type_id}"),
    }
}

/// A metadata value as the writer writes it.
pub enum V {
    /// A u32.
    U32(u32),
    /// An f32.
    F32(f32),
    /// A bool.
    Bool(bool),
    /// A string.
    Str(&'static str),
    /// An array of u32.
    U32s(Vec<u32>),
    /// An array of bools.
    Bools(Vec<bool>),
    /// An array of this many strings (`tok0`, `tok1`, …): a vocabulary.
    Strs(usize),
}

/// A tiny GGUF writer: the header, and tensor data as zeros when asked.
pub struct Gguf {
    /// Metadata, in the order written.
    pub kv: Vec<(String, V)>,
    /// Tensors: name, dimensions, type number, data bytes.
    pub tensors: Vec<(String, Vec<u64>, u32, u64)>,
    /// Written big-endian.
    pub big_endian: bool,
}

impl Gguf {
    /// A file of architecture `arch`, with no tensors yet.
    pub fn new(arch: &'static str) -> Gguf {
        Gguf {
            kv: vec![("general.architecture".into(), V::Str(arch))],
            tensors: Vec::new(),
            big_endian: false,
        }
    }

    /// Sets `key`, replacing what it was.
    pub fn kv(mut self, key: &str, value: V) -> Gguf {
        self.kv.retain(|(k, _)| k != key);
        self.kv.push((key.into(), value));
        self
    }

    /// Adds a tensor of a type the writer knows; its bytes follow from its shape.
    pub fn tensor(mut self, name: &str, dims: &[u64], type_id: u32) -> Gguf {
        let (size, blck) = block(type_id);
        let bytes = dims[0] / blck * size * dims[1..].iter().product::<u64>();
        self.tensors
            .push((name.into(), dims.to_vec(), type_id, bytes));
        self
    }

    /// A tensor of a type the writer does not know, with its data's size given.
    pub fn raw_tensor(mut self, name: &str, dims: &[u64], type_id: u32, bytes: u64) -> Gguf {
        self.tensors
            .push((name.into(), dims.to_vec(), type_id, bytes));
        self
    }

    /// The tensor table's bytes, summed.
    pub fn table_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.3).sum()
    }

    fn u32(&self, out: &mut Vec<u8>, v: u32) {
        out.extend(if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    }

    fn u64(&self, out: &mut Vec<u8>, v: u64) {
        out.extend(if self.big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        });
    }

    fn string(&self, out: &mut Vec<u8>, s: &str) {
        self.u64(out, s.len() as u64);
        out.extend(s.as_bytes());
    }

    /// The header, padded to the data's alignment: what a reader of the header needs.
    pub fn header(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        self.u32(&mut out, 3);
        self.u64(&mut out, self.tensors.len() as u64);
        self.u64(&mut out, self.kv.len() as u64);
        for (key, value) in &self.kv {
            self.string(&mut out, key);
            match value {
                V::U32(v) => {
                    self.u32(&mut out, 4);
                    self.u32(&mut out, *v);
                }
                V::F32(v) => {
                    self.u32(&mut out, 6);
                    self.u32(&mut out, v.to_bits());
                }
                V::Bool(v) => {
                    self.u32(&mut out, 7);
                    out.push(u8::from(*v));
                }
                V::Str(s) => {
                    self.u32(&mut out, 8);
                    self.string(&mut out, s);
                }
                V::U32s(items) => {
                    self.u32(&mut out, 9);
                    self.u32(&mut out, 4);
                    self.u64(&mut out, items.len() as u64);
                    for &v in items {
                        self.u32(&mut out, v);
                    }
                }
                V::Bools(items) => {
                    self.u32(&mut out, 9);
                    self.u32(&mut out, 7);
                    self.u64(&mut out, items.len() as u64);
                    out.extend(items.iter().map(|&b| u8::from(b)));
                }
                V::Strs(n) => {
                    self.u32(&mut out, 9);
                    self.u32(&mut out, 8);
                    self.u64(&mut out, *n as u64);
                    for i in 0..*n {
                        self.string(&mut out, &format!("tok{i}"));
                    }
                }
            }
        }
        let mut offset = 0u64;
        for (name, dims, type_id, bytes) in &self.tensors {
            self.string(&mut out, name);
            self.u32(&mut out, dims.len() as u32);
            for &d in dims {
                self.u64(&mut out, d);
            }
            self.u32(&mut out, *type_id);
            self.u64(&mut out, offset);
            offset = (offset + bytes).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        out
    }
}

/// A llama-architecture model as the bench writes it, with every tensor of `type_id`.
pub fn llama(
    layers: u32,
    embd: u64,
    ff: u64,
    heads: u32,
    kv_heads: u32,
    vocab: u64,
    type_id: u32,
) -> Gguf {
    let head_dim = embd / u64::from(heads);
    let mut g = Gguf::new("llama")
        .kv("llama.context_length", V::U32(4096))
        .kv("llama.embedding_length", V::U32(embd as u32))
        .kv("llama.feed_forward_length", V::U32(ff as u32))
        .kv("llama.block_count", V::U32(layers))
        .kv("llama.attention.head_count", V::U32(heads))
        .kv("llama.attention.head_count_kv", V::U32(kv_heads))
        .kv("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5))
        .kv("tokenizer.ggml.tokens", V::Strs(vocab as usize))
        .tensor("token_embd.weight", &[embd, vocab], type_id)
        .tensor("output_norm.weight", &[embd], 0)
        .tensor("output.weight", &[embd, vocab], type_id);
    let kv = head_dim * u64::from(kv_heads);
    for i in 0..layers {
        g = g
            .tensor(&format!("blk.{i}.attn_norm.weight"), &[embd], 0)
            .tensor(&format!("blk.{i}.attn_q.weight"), &[embd, embd], type_id)
            .tensor(&format!("blk.{i}.attn_k.weight"), &[embd, kv], type_id)
            .tensor(&format!("blk.{i}.attn_v.weight"), &[embd, kv], type_id)
            .tensor(
                &format!("blk.{i}.attn_output.weight"),
                &[embd, embd],
                type_id,
            )
            .tensor(&format!("blk.{i}.ffn_norm.weight"), &[embd], 0)
            .tensor(&format!("blk.{i}.ffn_gate.weight"), &[embd, ff], type_id)
            .tensor(&format!("blk.{i}.ffn_up.weight"), &[embd, ff], type_id)
            .tensor(&format!("blk.{i}.ffn_down.weight"), &[ff, embd], type_id);
    }
    g
}
