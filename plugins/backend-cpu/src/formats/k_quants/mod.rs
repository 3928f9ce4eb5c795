//! K-quants: super-blocks of 256 weights split into sub-blocks that carry their own small
//! integer scales (and mins), themselves scaled by f16 super-block factors.
//!
//! All are dotted against [`q8_k`] activations, whose per-16 `bsums` let the min terms be
//! applied once per sub-block.

pub mod q2_k;
pub mod q3_k;
pub mod q4_k;
pub mod q5_k;
pub mod q6_k;
pub mod q8_k;

/// Elements per super-block.
pub const QK_K: usize = 256;

/// Unpacks the 12 bytes of 6-bit (scale, min) pairs of the 8 sub-blocks of Q4_K and Q5_K.
///
/// Bytes 0–3 hold scales 0–3 in their low 6 bits, bytes 4–7 mins 0–3; sub-blocks 4–7 take
/// their low 4 bits from bytes 8–11 (scale low nibble, min high nibble) and their top 2
/// bits from the top 2 bits of bytes 0–3 (scales) and 4–7 (mins).
pub(crate) fn unpack_scale_min_k4(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = packed[j] & 0x3F;
        mn[j] = packed[j + 4] & 0x3F;
        sc[j + 4] = (packed[j + 8] & 0x0F) | ((packed[j] >> 6) << 4);
        mn[j + 4] = (packed[j + 8] >> 4) | ((packed[j + 4] >> 6) << 4);
    }
    (sc, mn)
}
