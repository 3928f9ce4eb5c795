//! Weights as rows of 16-byte texels, for the legacy row kernels on CPU adapters.
//!
//! llvmpipe (Mesa 22.3) reads a storage buffer at lane-dependent addresses one lane and one
//! word at a time, with a bounds check and a branch each; a texel fetch is one 16-byte load
//! per lane and no branch. So on CPU adapters Q4_1 and Q8_0 weights are also kept as an
//! `Rgba32Uint` texture. A weight row is a row of texels: each block's quants in whole
//! texels (Q4_1: 1, Q8_0: 2), then the blocks' scale words, 4 per texel (Q4_1: f16 d and m,
//! Q8_0: f16 d in the low half). [`INTERLEAVE`] weight rows share a texture row, texel by
//! texel (texel t of row r at x = 32t + r mod 32, y = r / 32), because llvmpipe runs 8
//! lanes (rows) at once: their fetches of one texel are then 128 contiguous bytes, and the
//! four fetches of an invocation taking 4 rows (the unrolled kernel) are 512: a vector of
//! lanes reads one forward stream, which the CPU's prefetcher follows, not four. The bytes
//! are the stored ones, moved: the same bits. Nothing here talks to a GPU.

use prima_abi::GgmlType;

/// Bytes per texel.
pub const TEXEL: usize = 16;

/// Weight rows per texture row, interleaved texel by texel (weights_texels.wgsl's `texel`).
pub const INTERLEAVE: usize = 32;

/// A weight's texel layout: quant texels per block and the scale word's bytes in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    quant_texels: usize,
    block_bytes: usize,
    /// Where the quants start in a stored block.
    quants_at: usize,
    /// The scale bytes at the start of a stored block (2 or 4).
    scale_bytes: usize,
}

impl Layout {
    /// The texel layout of `ty`, if the texture kernels read it.
    pub fn of(ty: GgmlType) -> Option<Layout> {
        match ty {
            GgmlType::Q4_1 => Some(Layout {
                quant_texels: 1,
                block_bytes: 20,
                quants_at: 4,
                scale_bytes: 4,
            }),
            GgmlType::Q8_0 => Some(Layout {
                quant_texels: 2,
                block_bytes: 34,
                quants_at: 2,
                scale_bytes: 2,
            }),
            _ => None,
        }
    }

    /// Texels per row of `blocks` blocks: the quants, then a scale word per block.
    pub fn width(&self, blocks: usize) -> usize {
        blocks * self.quant_texels + blocks.div_ceil(4)
    }

    /// Rows `rows` of stored blocks (`blocks` per row) as texture rows of [`INTERLEAVE`]
    /// weight rows each ([`Layout::texture_rows`] of them, the last padded with zeros).
    pub fn repack(&self, data: &[u8], blocks: usize, rows: usize) -> Vec<u8> {
        let width = self.width(blocks);
        let mut out = vec![0u8; Self::texture_rows(rows) * INTERLEAVE * width * TEXEL];
        // Texel t of weight row r.
        let at = |r: usize, t: usize| {
            ((r / INTERLEAVE * width + t) * INTERLEAVE + r % INTERLEAVE) * TEXEL
        };
        let q = self.quant_texels * TEXEL;
        for (r, src) in data.chunks_exact(blocks * self.block_bytes).enumerate() {
            for (b, block) in src.chunks_exact(self.block_bytes).enumerate() {
                let quants = &block[self.quants_at..self.quants_at + q];
                for (i, texel) in quants.chunks_exact(TEXEL).enumerate() {
                    let o = at(r, b * self.quant_texels + i);
                    out[o..o + TEXEL].copy_from_slice(texel);
                }
                let o = at(r, blocks * self.quant_texels + b / 4) + (b % 4) * 4;
                out[o..o + self.scale_bytes].copy_from_slice(&block[..self.scale_bytes]);
            }
        }
        out
    }

    /// Texture rows that hold `rows` weight rows.
    pub fn texture_rows(rows: usize) -> usize {
        rows.div_ceil(INTERLEAVE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_blocks_become_quant_texels_then_scale_words() {
        let l = Layout::of(GgmlType::Q8_0).unwrap();
        // Two rows of 5 blocks: block b of row r has d = [r, b], quants 32 × (10r + b).
        let mut data = Vec::new();
        for r in 0..2u8 {
            for b in 0..5u8 {
                data.extend([r, b]);
                data.extend([10 * r + b; 32]);
            }
        }
        assert_eq!(l.width(5), 12);
        let t = l.repack(&data, 5, 2);
        // One texture row of INTERLEAVE weight rows (all but 2 of them padding), 12 texels each.
        assert_eq!(t.len(), INTERLEAVE * 12 * TEXEL);
        // Texel j of weight row 1, which is the second of each run of INTERLEAVE.
        let row1 = |j: usize| &t[(j * INTERLEAVE + 1) * TEXEL..(j * INTERLEAVE + 2) * TEXEL];
        // Block 3's quants: texels 6 and 7.
        assert!(row1(6).iter().chain(row1(7)).all(|&v| v == 13));
        // Scale words from texel 10: block 3's at bytes 12..16 of it.
        assert_eq!(&row1(10)[12..16], &[1, 3, 0, 0]);
        assert_eq!(&row1(11)[..4], &[1, 4, 0, 0]);
        // Row 0's block 3, and the padding rows.
        assert!(t[6 * INTERLEAVE * TEXEL..][..TEXEL].iter().all(|&v| v == 3));
        assert!(t[(6 * INTERLEAVE + 2) * TEXEL..][..TEXEL]
            .iter()
            .all(|&v| v == 0));
    }

    #[test]
    fn q4_1_keeps_d_and_m_in_one_word() {
        let l = Layout::of(GgmlType::Q4_1).unwrap();
        let block: Vec<u8> = (0..20).collect();
        let t = l.repack(&block, 1, 1);
        assert_eq!(t.len(), INTERLEAVE * 2 * TEXEL);
        assert_eq!(&t[..16], &block[4..20]);
        let scales = &t[INTERLEAVE * TEXEL..];
        assert_eq!(&scales[..4], &block[..4]);
        assert!(Layout::of(GgmlType::Q4_0).is_none());
    }
}
