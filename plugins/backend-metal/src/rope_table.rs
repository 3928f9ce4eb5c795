//! RoPE's (cos, sin) per token and pair, computed on the host by the same code as the CPU
//! backend's (`RopeParams::fill_cos_sin` in the ABI): the same f32 operations and the
//! host's own `cosf`/`sinf`, so the GPU rotates by the CPU's bits.
//! A GPU's cos/sin are an ulp apart now and then, and each such ulp can move an activation
//! across a quantization boundary downstream. The table is small (n_tokens × n_rot floats)
//! and only the rotation runs on the GPU (rope.wgsl).

use prima_core::plugin::backend_abi::RopeParams;

/// `[cos, sin]` of every pair (`n_rot / 2` of them) of every position, token-major:
/// `table[(t · n_rot/2 + i) · 2 ..]`. `freq_factors`, when given, has `n_rot / 2` entries.
pub fn table(positions: &[u32], p: &RopeParams<'_>, n_rot: usize) -> Vec<f32> {
    let half = n_rot / 2;
    let corr = p.yarn_corr_dims(n_rot);
    let mut out = vec![0f32; positions.len() * 2 * half];
    for (&pos, cs_pos) in positions.iter().zip(out.chunks_exact_mut(2 * half)) {
        p.fill_cos_sin(cs_pos, pos, n_rot, corr);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi_stable::std_types::ROption;

    fn params(freq_factors: Option<&[f32]>) -> RopeParams<'_> {
        RopeParams {
            n_rot: 8,
            freq_base: 10_000.0,
            freq_scale: 1.0,
            neox: false,
            freq_factors: match freq_factors {
                Some(f) => ROption::RSome(abi_stable::std_types::RSlice::from_slice(f)),
                None => ROption::RNone,
            },
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        }
    }

    #[test]
    fn position_zero_is_the_identity_and_pair_zero_turns_by_the_position() {
        let t = table(&[0, 3], &params(None), 8);
        assert_eq!(t.len(), 2 * 8);
        for cs in t[..8].chunks_exact(2) {
            assert_eq!(cs, [1.0, 0.0]);
        }
        // Pair 0 of position 3: θ = 3.
        assert_eq!(&t[8..10], &[3.0f32.cos(), 3.0f32.sin()]);
        // Pair 1: θ = 3 · 10000^(−1/4).
        let theta = 3.0 * 10_000f32.powf(-2.0 / 8.0);
        assert_eq!(&t[10..12], &[theta.cos(), theta.sin()]);
    }

    #[test]
    fn frequency_factors_divide_the_angle() {
        let f = [1.0, 2.0, 4.0, 8.0];
        let t = table(&[5], &params(Some(&f)), 8);
        let theta = 5.0 * 10_000f32.powf(-2.0 / 8.0) * 10_000f32.powf(-2.0 / 8.0);
        assert_eq!(t[4], (theta / 4.0).cos());
    }
}
