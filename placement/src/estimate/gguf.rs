//! The GGUF header (versions 2 and 3): metadata key/values and the tensor table, read from the first bytes of
//! a file. A room of its own because it is a file format, kept apart from what the estimate makes of it.
//!
//! Only the header is read, never tensor data: the server reads a prefix of the file and, when the header
//! runs past it, is told how many bytes it needs ([`GgufError::Truncated`]). Tokenizer vocabularies make
//! headers of a few MiB; reading 8 MiB first and growing to what is asked covers all but the largest.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Alignment of tensor data when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Arrays longer than this keep only their length: per-layer arrays are kept, a vocabulary's scores are not.
pub const MAX_KEPT_ARRAY: u64 = 4096;

/// Lengths past these are a damaged file, not a model: refusing them keeps a caller from reading gigabytes
/// because one length field was garbage.
const MAX_STRING: u64 = 1 << 24;
const MAX_ARRAY: u64 = 1 << 28;
const MAX_TENSORS: u64 = 1 << 24;
const MAX_KEYS: u64 = 1 << 20;
const MAX_DIMS: u32 = 4;

/// Why a prefix is not a GGUF header Tessera can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum GgufError {
    /// The magic bytes are wrong.
    #[error("not a GGUF file")]
    NotGguf,
    /// A version this reader does not know (1 used 32-bit lengths and is long gone).
    #[error("GGUF version {0} is not supported (2 and 3 are)")]
    UnsupportedVersion(u32),
    /// The prefix ends inside the header; read at least `needed` bytes from the start and try again.
    #[error("truncated: need {needed} bytes")]
    Truncated {
        /// Bytes from the file's start that the next read reaches.
        needed: u64,
    },
    /// A metadata value of a type GGUF does not define.
    #[error("unknown metadata value type {type_id} for key {key}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The type number found.
        type_id: u32,
    },
    /// The same key twice.
    #[error("metadata key {0} appears twice")]
    DuplicateKey(String),
    /// A tensor with more dimensions than ggml has.
    #[error("tensor {name} has {dims} dimensions; ggml has at most 4")]
    TooManyDims {
        /// The tensor.
        name: String,
        /// Its number of dimensions.
        dims: u32,
    },
    /// `general.alignment` that is not a power of two.
    #[error("general.alignment is {0}; it must be a power of two")]
    BadAlignment(u64),
    /// A count or length no real file has.
    #[error("{what} is {value}, more than any GGUF file holds")]
    Implausible {
        /// What was being read.
        what: &'static str,
        /// The number found.
        value: u64,
    },
}

/// A metadata value. Integers are widened, so `u8` to `u64` all read as [`Value::Uint`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Value {
    /// An unsigned integer of any width.
    Uint(u64),
    /// A signed integer of any width.
    Int(i64),
    /// A float of either width.
    Float(f64),
    /// A boolean.
    Bool(bool),
    /// A string (invalid UTF-8 replaced).
    Text(String),
    /// An array; its items are kept only when short and not strings.
    Array(ArrayValue),
}

/// An array value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrayValue {
    /// Its length in the file.
    pub len: u64,
    /// Its items when kept ([`MAX_KEPT_ARRAY`] numbers or booleans at most), else empty.
    pub items: Vec<Value>,
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Uint(v) => Some(v),
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a `u32`, if it is an integer that fits.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_u64().and_then(|v| u32::try_from(v).ok())
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::Uint(v) => Some(v as f64),
            Value::Int(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The value as a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&ArrayValue> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// One row of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorInfo {
    /// Its name, such as `blk.0.ffn_up.weight`.
    pub name: String,
    /// Its shape, innermost first (ggml's `ne`): a row has `dims[0]` elements.
    pub dims: Vec<u64>,
    /// Its ggml type number ([`super::GgmlType::from_id`]).
    pub type_id: u32,
    /// Where its data starts, from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Its number of elements; `None` if that overflows (a damaged table).
    pub fn elements(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, &d| n.checked_mul(d))
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GgufHeader {
    /// The format version (2 or 3).
    pub version: u32,
    /// The metadata, by key.
    pub metadata: BTreeMap<String, Value>,
    /// The tensor table, in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of tensor data in bytes.
    pub alignment: u64,
    /// Where tensor data starts, from the file's start: the header's length, padding included.
    pub data_offset: u64,
}

impl GgufHeader {
    /// Reads the header from the first bytes of a file.
    pub fn parse(prefix: &[u8]) -> Result<GgufHeader, GgufError> {
        let mut r = Reader {
            bytes: prefix,
            pos: 0,
            big_endian: false,
        };
        if r.take(4)? != b"GGUF" {
            return Err(GgufError::NotGguf);
        }
        let raw = r.u32()?;
        // A big-endian file (written for s390x) has its version byte-swapped.
        let version = if raw.swap_bytes() == 2 || raw.swap_bytes() == 3 {
            r.big_endian = true;
            raw.swap_bytes()
        } else {
            raw
        };
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = bounded(r.u64()?, MAX_TENSORS, "the number of tensors")?;
        let n_keys = bounded(r.u64()?, MAX_KEYS, "the number of metadata keys")?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_keys {
            let key = r.string()?;
            let type_id = r.u32()?;
            let value = r.value(&key, type_id)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if n_dims > MAX_DIMS {
                return Err(GgufError::TooManyDims { name, dims: n_dims });
            }
            let dims = (0..n_dims).map(|_| r.u64()).collect::<Result<_, _>>()?;
            let type_id = r.u32()?;
            let offset = r.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                type_id,
                offset,
            });
        }
        let alignment = match metadata.get("general.alignment") {
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() => a,
                other => return Err(GgufError::BadAlignment(other.unwrap_or(0))),
            },
            None => DEFAULT_ALIGNMENT,
        };
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        Ok(GgufHeader {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
}

fn bounded(value: u64, max: u64, what: &'static str) -> Result<u64, GgufError> {
    if value > max {
        Err(GgufError::Implausible { what, value })
    } else {
        Ok(value)
    }
}

/// Bytes of one value of a fixed-size metadata type.
fn fixed_size(type_id: u32) -> Option<u64> {
    match type_id {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

/// A cursor over the prefix: every read either succeeds or says how far the file must be read.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: u64) -> Result<&'a [u8], GgufError> {
        let end = (self.pos as u64).saturating_add(n);
        if end > self.bytes.len() as u64 {
            return Err(GgufError::Truncated { needed: end });
        }
        let slice = &self.bytes[self.pos..end as usize];
        self.pos = end as usize;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64)?);
        if self.big_endian {
            out.reverse();
        }
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, GgufError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, GgufError> {
        self.array().map(u64::from_le_bytes)
    }

    fn string(&mut self) -> Result<String, GgufError> {
        let len = bounded(self.u64()?, MAX_STRING, "a string's length")?;
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }

    fn value(&mut self, key: &str, type_id: u32) -> Result<Value, GgufError> {
        Ok(match type_id {
            0 => Value::Uint(u64::from(u8::from_le_bytes(self.array()?))),
            1 => Value::Int(i64::from(i8::from_le_bytes(self.array()?))),
            2 => Value::Uint(u64::from(u16::from_le_bytes(self.array()?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.array()?))),
            4 => Value::Uint(u64::from(self.u32()?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.array()?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.array()?))),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Text(self.string()?),
            9 => {
                let item_type = self.u32()?;
                let len = bounded(self.u64()?, MAX_ARRAY, "an array's length")?;
                let keep = item_type != 8 && item_type != 9 && len <= MAX_KEPT_ARRAY;
                if let (false, Some(size)) = (keep, fixed_size(item_type)) {
                    // Skipped whole, so a short prefix is told the array's end, not its next item's.
                    self.take(len.saturating_mul(size))?;
                    return Ok(Value::Array(ArrayValue {
                        len,
                        items: Vec::new(),
                    }));
                }
                let mut items = Vec::new();
                for _ in 0..len {
                    let item = self.value(key, item_type)?;
                    if keep {
                        items.push(item);
                    }
                }
                Value::Array(ArrayValue { len, items })
            }
            10 => Value::Uint(self.u64()?),
            11 => Value::Int(i64::from_le_bytes(self.array()?)),
            12 => Value::Float(f64::from_le_bytes(self.array()?)),
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_string(),
                    type_id,
                })
            }
        })
    }
}
