//! The weights: each tensor's bytes from its type and shape, summed exactly. Its own room because it is the
//! one part that needs no model knowledge, only the tensor table, and so is exact for any architecture.

use super::ggml_type::GgmlType;
use super::gguf::{GgufHeader, TensorInfo};
use super::Gap;
use crate::units::Bytes;
use serde::{Deserialize, Serialize};

/// What the tensor table weighs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Weights {
    /// All tensors that could be sized. Exact when `exact`.
    pub bytes: Bytes,
    /// False when some tensor was sized from the offsets around it, or not at all (see the gaps).
    pub exact: bool,
    /// Tensors in the table.
    pub tensors: u32,
    /// Bytes by tensor type, largest first.
    pub by_type: Vec<TypeBytes>,
    /// Bytes of each repeating layer (`blk.N.*`), by layer number: what offloading a layer moves.
    pub per_layer: Vec<Bytes>,
    /// Bytes outside the layers: embeddings, output head, final norm.
    pub outside_layers: Bytes,
}

/// The tensors of one type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeBytes {
    /// The type's name as ggml writes it (`q4_K`), or `type N` for one not known.
    pub ggml_type: String,
    /// How many tensors.
    pub tensors: u32,
    /// Their bytes.
    pub bytes: Bytes,
}

/// The bytes of one tensor, or why they cannot be told from its type and shape.
pub fn tensor_bytes(tensor: &TensorInfo) -> Result<Bytes, Gap> {
    let Some(ggml_type) = GgmlType::from_id(tensor.type_id) else {
        return Err(match GgmlType::removed_name(tensor.type_id) {
            Some(name) => Gap::RemovedTensorType {
                tensor: tensor.name.clone(),
                type_id: tensor.type_id,
                name: name.to_string(),
            },
            None => Gap::UnknownTensorType {
                tensor: tensor.name.clone(),
                type_id: tensor.type_id,
                sized_from_offsets: None,
            },
        });
    };
    let row = tensor.dims.first().copied().unwrap_or(1);
    let rows = tensor
        .dims
        .iter()
        .skip(1)
        .try_fold(1u64, |n, &d| n.checked_mul(d));
    let partial = || Gap::PartialBlock {
        tensor: tensor.name.clone(),
        ggml_type,
        row,
    };
    let row_bytes = ggml_type.row_bytes(row).ok_or_else(partial)?;
    rows.and_then(|rows| rows.checked_mul(row_bytes))
        .map(Bytes)
        .ok_or_else(partial)
}

/// The layer a tensor belongs to, from its name (`blk.12.attn_q.weight` is layer 12).
pub(super) fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Sums the tensor table. A tensor of an unknown type is sized from where the next tensor starts (its
/// bytes plus at most the alignment's padding), or from `file_len` for the last one; what cannot be sized
/// is a gap, and the rest is still summed.
pub fn weigh(header: &GgufHeader, file_len: Option<Bytes>) -> (Weights, Vec<Gap>) {
    let mut gaps = Vec::new();
    let mut sizes: Vec<Option<Bytes>> = Vec::with_capacity(header.tensors.len());
    for tensor in &header.tensors {
        match tensor_bytes(tensor) {
            Ok(bytes) => sizes.push(Some(bytes)),
            Err(gap) => {
                sizes.push(None);
                gaps.push(gap);
            }
        }
    }
    let mut exact = gaps.is_empty();
    for gap in &mut gaps {
        if let Gap::UnknownTensorType {
            tensor,
            sized_from_offsets,
            ..
        } = gap
        {
            let Some(i) = header.tensors.iter().position(|t| &t.name == tensor) else {
                continue;
            };
            *sized_from_offsets = from_offsets(header, i, file_len);
            sizes[i] = *sized_from_offsets;
        }
    }
    if sizes.iter().any(Option::is_none) {
        exact = false;
    }

    let mut by_type: Vec<TypeBytes> = Vec::new();
    let mut per_layer: Vec<Bytes> = Vec::new();
    let mut outside_layers = Bytes::ZERO;
    for (tensor, size) in header.tensors.iter().zip(&sizes) {
        let Some(size) = *size else { continue };
        let type_name = GgmlType::from_id(tensor.type_id)
            .map(|t| t.name().to_string())
            .unwrap_or_else(|| format!("type {}", tensor.type_id));
        match by_type.iter_mut().find(|t| t.ggml_type == type_name) {
            Some(row) => {
                row.tensors += 1;
                row.bytes += size;
            }
            None => by_type.push(TypeBytes {
                ggml_type: type_name,
                tensors: 1,
                bytes: size,
            }),
        }
        match layer_of(&tensor.name) {
            Some(layer) => {
                if per_layer.len() <= layer {
                    per_layer.resize(layer + 1, Bytes::ZERO);
                }
                per_layer[layer] += size;
            }
            None => outside_layers += size,
        }
    }
    by_type.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.ggml_type.cmp(&b.ggml_type)));
    let weights = Weights {
        bytes: sizes.iter().flatten().copied().sum(),
        exact,
        tensors: header.tensors.len() as u32,
        by_type,
        per_layer,
        outside_layers,
    };
    (weights, gaps)
}

/// The room tensor `i` has in the data section: up to the next tensor's offset, or to the file's end.
fn from_offsets(header: &GgufHeader, i: usize, file_len: Option<Bytes>) -> Option<Bytes> {
    let start = header.tensors[i].offset;
    let next = header
        .tensors
        .iter()
        .map(|t| t.offset)
        .filter(|&o| o > start)
        .min();
    let end = match next {
        Some(next) => next,
        None => file_len?.get().checked_sub(header.data_offset)?,
    };
    end.checked_sub(start).map(Bytes)
}
