//! The tensor element types a GGUF file can declare, with their block geometry.
//!
//! Type ids and block layouts are part of the public GGUF format; the kernels that
//! read these blocks live in the backend plugins, not here.

use std::fmt;

/// A tensor element type as numbered in the GGUF format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    IQ4NL = 20,
    IQ4XS = 23,
    BF16 = 30,
    MXFP4 = 39,
}

/// Elements per super-block of the K-quant formats.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every type this engine can read.
    pub const ALL: [GgmlType; 18] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// Maps a GGUF type id to a type, or `None` for ids this engine does not support.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| *t as u32 == id)
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements stored per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 32,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::IQ4NL | GgmlType::MXFP4 => 32,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K => QK_K,
            GgmlType::Q6K | GgmlType::Q8K | GgmlType::IQ4XS => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q8_1 => 2 + 2 + 32,
            GgmlType::Q2K => QK_K / 16 + QK_K / 4 + 2 + 2,
            GgmlType::Q3K => QK_K / 8 + QK_K / 4 + 12 + 2,
            GgmlType::Q4K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
            GgmlType::Q8K => 4 + QK_K + 2 * QK_K / 16,
            // d, then 16 bytes of nibbles (table indices).
            GgmlType::IQ4NL => 2 + 16,
            // d, scales_h (2 high bits of 8 sub-block scales), scales_l (4 low bits each),
            // then the nibbles.
            GgmlType::IQ4XS => 2 + 2 + QK_K / 64 + QK_K / 2,
            // e (an E8M0 power-of-two scale, one byte), then 16 bytes of nibbles (FP4 E2M1
            // codes).
            GgmlType::MXFP4 => 1 + 16,
        }
    }

    /// Bytes needed for a row of `elems` elements, or `None` when `elems` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, elems: usize) -> Option<usize> {
        let be = self.block_elems();
        elems
            .is_multiple_of(be)
            .then(|| elems / be * self.block_bytes())
    }

    /// The name GGUF tools print for this type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q8_1 => "Q8_1",
            GgmlType::Q2K => "Q2_K",
            GgmlType::Q3K => "Q3_K",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Q8K => "Q8_K",
            GgmlType::IQ4NL => "IQ4_NL",
            GgmlType::IQ4XS => "IQ4_XS",
            GgmlType::BF16 => "BF16",
            GgmlType::MXFP4 => "MXFP4",
        }
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
    fn block_sizes_match_the_format() {
        // Sizes from the GGUF format description of each block layout.
        let expected = [
            (GgmlType::Q4_0, 18),
            (GgmlType::Q4_1, 20),
            (GgmlType::Q5_0, 22),
            (GgmlType::Q5_1, 24),
            (GgmlType::Q8_0, 34),
            (GgmlType::Q8_1, 36),
            (GgmlType::Q2K, 84),
            (GgmlType::Q3K, 110),
            (GgmlType::Q4K, 144),
            (GgmlType::Q5K, 176),
            (GgmlType::Q6K, 210),
            (GgmlType::Q8K, 292),
            (GgmlType::IQ4NL, 18),
            (GgmlType::IQ4XS, 136),
            (GgmlType::MXFP4, 17),
        ];
        for (t, bytes) in expected {
            assert_eq!(t.block_bytes(), bytes, "{t}");
        }
    }

    #[test]
    fn ids_round_trip_and_unknown_ids_are_refused() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(16), None);
    }
}
