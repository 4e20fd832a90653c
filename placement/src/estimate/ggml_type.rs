//! ggml's tensor types and what one element costs in each: a room of its own because the table is llama.cpp's
//! (`type_traits` in ggml/src/ggml.c and the block structs of ggml/src/ggml-common.h), copied by hand, and is
//! checked against the engine by `scripts/bench-estimate`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A tensor type llama.cpp can load, by its number in the GGUF tensor table.
///
/// Quantized types store a row in blocks: `block_size` elements take `type_size` bytes together, so a row's
/// length must be a whole number of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)] // the names are ggml's own
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    Iq2Xxs,
    Iq2Xs,
    Iq3Xxs,
    Iq1S,
    Iq4Nl,
    Iq3S,
    Iq2S,
    Iq4Xs,
    I8,
    I16,
    I32,
    I64,
    F64,
    Iq1M,
    Bf16,
    Tq1_0,
    Tq2_0,
    Mxfp4,
    Nvfp4,
    Q1_0,
    Q2_0,
}

/// Every known type with its GGUF number, ggml's name, elements per block and bytes per block.
///
/// Q2_0's block (64 elements in 18 bytes) was checked against the engine itself: a file written with that
/// size loads in PyPI's xllamacpp 2026.10.11549, whose loader refuses a tensor whose offsets disagree.
const TABLE: [(GgmlType, u32, &str, u64, u64); 35] = [
    (GgmlType::F32, 0, "f32", 1, 4),
    (GgmlType::F16, 1, "f16", 1, 2),
    (GgmlType::Q4_0, 2, "q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "q8_1", 32, 36),
    (GgmlType::Q2K, 10, "q2_K", 256, 84),
    (GgmlType::Q3K, 11, "q3_K", 256, 110),
    (GgmlType::Q4K, 12, "q4_K", 256, 144),
    (GgmlType::Q5K, 13, "q5_K", 256, 176),
    (GgmlType::Q6K, 14, "q6_K", 256, 210),
    (GgmlType::Q8K, 15, "q8_K", 256, 292),
    (GgmlType::Iq2Xxs, 16, "iq2_xxs", 256, 66),
    (GgmlType::Iq2Xs, 17, "iq2_xs", 256, 74),
    (GgmlType::Iq3Xxs, 18, "iq3_xxs", 256, 98),
    (GgmlType::Iq1S, 19, "iq1_s", 256, 50),
    (GgmlType::Iq4Nl, 20, "iq4_nl", 32, 18),
    (GgmlType::Iq3S, 21, "iq3_s", 256, 110),
    (GgmlType::Iq2S, 22, "iq2_s", 256, 82),
    (GgmlType::Iq4Xs, 23, "iq4_xs", 256, 136),
    (GgmlType::I8, 24, "i8", 1, 1),
    (GgmlType::I16, 25, "i16", 1, 2),
    (GgmlType::I32, 26, "i32", 1, 4),
    (GgmlType::I64, 27, "i64", 1, 8),
    (GgmlType::F64, 28, "f64", 1, 8),
    (GgmlType::Iq1M, 29, "iq1_m", 256, 56),
    (GgmlType::Bf16, 30, "bf16", 1, 2),
    (GgmlType::Tq1_0, 34, "tq1_0", 256, 54),
    (GgmlType::Tq2_0, 35, "tq2_0", 256, 66),
    (GgmlType::Mxfp4, 39, "mxfp4", 32, 17),
    (GgmlType::Nvfp4, 40, "nvfp4", 64, 36),
    (GgmlType::Q1_0, 41, "q1_0", 128, 18),
    (GgmlType::Q2_0, 42, "q2_0", 64, 18),
];

/// Numbers ggml once used and has since removed (the old Q4_2/Q4_3 and the repacked layouts that llama.cpp
/// now makes at load time), with the name ggml gives them.
const REMOVED: [(u32, &str); 8] = [
    (4, "q4_2"),
    (5, "q4_3"),
    (31, "q4_0_4_4"),
    (32, "q4_0_4_8"),
    (33, "q4_0_8_8"),
    (36, "iq4_nl_4_4"),
    (37, "iq4_nl_4_8"),
    (38, "iq4_nl_8_8"),
];

impl GgmlType {
    /// The type numbered `id` in a GGUF tensor table, if ggml still knows it.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    /// ggml's name for a type number that has been removed, such as 31 (`q4_0_4_4`).
    pub fn removed_name(id: u32) -> Option<&'static str> {
        REMOVED.iter().find(|row| row.0 == id).map(|row| row.1)
    }

    /// Reads a KV cache type as llama.cpp's `--cache-type-k` takes it (`f16`, `q8_0`, ...).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        let name = name.trim().to_ascii_lowercase();
        TABLE
            .iter()
            .find(|row| row.2.eq_ignore_ascii_case(&name))
            .map(|row| row.0)
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, u64, u64) {
        TABLE
            .iter()
            .find(|row| row.0 == self)
            .expect("every type is in the table")
    }

    /// Its number in a GGUF tensor table.
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name for it, as llama.cpp's log writes it (`q4_K`, `f16`).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> u64 {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.row().4
    }

    /// Bytes of a row of `elements`, as ggml's `ggml_row_size`; `None` when the row is not a whole number of
    /// blocks, which llama.cpp refuses to load.
    pub fn row_bytes(self, elements: u64) -> Option<u64> {
        if !elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (elements / self.block_size()).checked_mul(self.type_size())
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_reads_back_from_its_number_and_its_name() {
        for row in TABLE {
            assert_eq!(GgmlType::from_id(row.1), Some(row.0));
            assert_eq!(GgmlType::from_name(row.2), Some(row.0));
            assert_eq!(row.0.id(), row.1);
        }
    }

    #[test]
    fn block_sizes_are_those_of_ggml() {
        // Bits per weight as llama.cpp's quantize tool lists them.
        let bpw = |t: GgmlType| t.type_size() as f64 * 8.0 / t.block_size() as f64;
        assert_eq!(bpw(GgmlType::Q4_0), 4.5);
        assert_eq!(bpw(GgmlType::Q8_0), 8.5);
        assert_eq!(bpw(GgmlType::Q4K), 4.5);
        assert_eq!(bpw(GgmlType::Q6K), 6.5625);
        assert_eq!(bpw(GgmlType::Iq4Xs), 4.25);
        assert_eq!(bpw(GgmlType::Iq2Xxs), 2.0625);
        assert_eq!(bpw(GgmlType::Tq1_0), 1.6875);
        assert_eq!(bpw(GgmlType::Mxfp4), 4.25);
    }

    #[test]
    fn a_row_that_is_not_whole_blocks_has_no_size() {
        assert_eq!(GgmlType::Q4K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4K.row_bytes(300), None);
        assert_eq!(GgmlType::F16.row_bytes(3), Some(6));
    }

    #[test]
    fn removed_numbers_are_named_and_unknown_ones_are_not() {
        assert_eq!(GgmlType::from_id(31), None);
        assert_eq!(GgmlType::removed_name(31), Some("q4_0_4_4"));
        assert_eq!(GgmlType::from_id(99), None);
        assert_eq!(GgmlType::removed_name(99), None);
    }
}
