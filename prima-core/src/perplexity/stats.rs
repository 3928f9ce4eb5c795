//! The statistics of a scored text: negative log-likelihoods and their perplexity with its
//! standard error, and the KL divergence of a model's next-token distributions from a
//! reference's. Each formula is llama-perplexity's, in the same floating-point widths
//! (f32 logits, f64 sums), so the printed figures compare digit for digit.

use super::logits_file::BaseRow;

/// −log p(`tok`) under the softmax of `logits`: `max + ln Σ exp(l − max) − l_tok`.
pub fn nll(logits: &[f32], tok: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    -(f64::from(logits[tok as usize] - max) - sum_exp.ln())
}

/// Sums of negative log-likelihoods, from which perplexity and its error follow.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NllStats {
    sum: f64,
    sum2: f64,
    count: usize,
}

impl NllStats {
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    /// Tokens scored so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// exp(mean NLL).
    pub fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// The standard error of [`NllStats::ppl`]: PPL · σ(NLL) / √(N − 1), the error of the
    /// mean NLL carried through exp. `None` when the variance is not positive (one token,
    /// or all alike).
    pub fn ppl_error(&self) -> Option<f64> {
        let n = self.count as f64;
        let mean = self.sum / n;
        let var = self.sum2 / n - mean * mean;
        (var > 0.0 && self.count > 1).then(|| (var / (n - 1.0)).sqrt() * self.ppl())
    }
}

/// A mean and its standard error from a sum and a sum of squares (0 below 11 samples, as
/// llama-perplexity).
pub fn mean_and_error(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let mean = sum / n;
    let var = sum2 / n - mean * mean;
    let error = if var > 0.0 && count > 10 {
        (var / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (mean, error)
}

/// The covariance of two means (0 below 10 samples).
fn covariance(sum_a: f64, sum_b: f64, sum_ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1.0)
}

/// The comparison of a model (Q) with reference log-probabilities (base), token by token.
#[derive(Debug, Clone, Default)]
pub struct KldStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    n_same_top: usize,
    count: usize,
    /// Every token's KL divergence and Δp, for the percentiles.
    klds: Vec<f32>,
    p_diffs: Vec<f32>,
}

/// A value and its standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub value: f64,
    pub error: f64,
}

impl KldStats {
    /// Scores one position: `logits` (the model's), the reference's log-probabilities
    /// `base`, and `tok`, the token that followed. Returns the position's KL divergence
    /// KL(base ‖ Q) = Σ p_base · (log p_base − log p_Q), over the reference tokens whose
    /// log-probability is above −16 (the rest are below what the file resolves).
    pub fn add(&mut self, logits: &[f32], base: &BaseRow<'_>, tok: u32) -> f64 {
        let (mut imax, mut max) = (0, logits[0]);
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max {
                (imax, max) = (i, l);
            }
        }
        let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let tok = tok as usize;
        let nll = max + log_sum_exp - logits[tok];
        let nll_base = -base.log_prob(tok);
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);

        // log p_Q(i) = l_i − (max + ln Σ).
        let log_norm = max + log_sum_exp;
        let mut kld = 0.0f64;
        let (mut imax_base, mut base_max) = (0, f32::NEG_INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            let log_p_base = base.log_prob(i);
            if i == 0 || log_p_base > base_max {
                (imax_base, base_max) = (i, log_p_base);
            }
            if log_p_base > -16.0 {
                kld += f64::from(log_p_base.exp() * (log_p_base - l + log_norm));
            }
        }
        self.sum_kld += kld;
        self.sum_kld2 += kld * kld;
        self.count += 1;
        self.n_same_top += usize::from(imax == imax_base);

        // Δp: the change in the probability of the token that came.
        let p_diff = (-nll).exp() - (-nll_base).exp();
        let p_diff2 = f64::from(p_diff * p_diff);
        self.sum_p_diff += f64::from(p_diff);
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.klds.push(kld as f32);
        self.p_diffs.push(p_diff);
        kld
    }

    pub fn count(&self) -> usize {
        self.count
    }

    fn log_ppl(&self) -> (f64, f64) {
        mean_and_error(self.sum_nll, self.sum_nll2, self.count)
    }

    fn log_ppl_base(&self) -> (f64, f64) {
        mean_and_error(self.sum_nll_base, self.sum_nll_base2, self.count)
    }

    fn exp_estimate((value, error): (f64, f64)) -> Estimate {
        Estimate {
            value: value.exp(),
            error: value.exp() * error,
        }
    }

    /// PPL(Q), the model's perplexity.
    pub fn ppl(&self) -> Estimate {
        Self::exp_estimate(self.log_ppl())
    }

    /// PPL(base), the reference's perplexity (from its stored log-probabilities).
    pub fn ppl_base(&self) -> Estimate {
        Self::exp_estimate(self.log_ppl_base())
    }

    /// ln(PPL(Q)/PPL(base)), whose error accounts for the two being correlated.
    pub fn log_ppl_ratio(&self) -> Estimate {
        let (q, q_err) = self.log_ppl();
        let (b, b_err) = self.log_ppl_base();
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        Estimate {
            value: q - b,
            error: (q_err * q_err + b_err * b_err - 2.0 * cov).max(0.0).sqrt(),
        }
    }

    /// PPL(Q)/PPL(base).
    pub fn ppl_ratio(&self) -> Estimate {
        let r = self.log_ppl_ratio();
        Self::exp_estimate((r.value, r.error))
    }

    /// Correlation of the per-token NLLs of Q and base.
    pub fn log_ppl_correlation(&self) -> f64 {
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        cov / (self.log_ppl().1 * self.log_ppl_base().1)
    }

    /// Mean KL divergence per token.
    pub fn kld(&self) -> Estimate {
        let (value, error) = mean_and_error(self.sum_kld, self.sum_kld2, self.count);
        Estimate { value, error }
    }

    /// Root mean square of Δp.
    pub fn p_diff_rms(&self) -> Estimate {
        let (mse, mse_err) = mean_and_error(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.sqrt();
        Estimate {
            value: rms,
            error: if rms > 0.0 { 0.5 / rms * mse_err } else { 0.0 },
        }
    }

    /// Mean Δp.
    pub fn p_diff(&self) -> Estimate {
        let (value, error) = mean_and_error(self.sum_p_diff, self.sum_p_diff2, self.count);
        Estimate { value, error }
    }

    pub fn max_p_diff(&self) -> f32 {
        self.max_p_diff
    }

    /// The fraction of positions where Q's most likely token is the reference's.
    pub fn same_top(&self) -> Estimate {
        let n = self.count as f64;
        let p = self.n_same_top as f64 / n;
        Estimate {
            value: p,
            error: if self.count > 1 {
                (p * (1.0 - p) / (n - 1.0)).sqrt()
            } else {
                0.0
            },
        }
    }

    /// The KL divergences at the given fractions (0 = minimum, 0.5 = median, 1 =
    /// maximum), interpolated linearly between neighbours.
    pub fn kld_percentiles(&self, fractions: &[f64]) -> Vec<f64> {
        percentiles(&self.klds, fractions)
    }

    /// The Δp values at the given fractions.
    pub fn p_diff_percentiles(&self, fractions: &[f64]) -> Vec<f64> {
        percentiles(&self.p_diffs, fractions)
    }
}

/// The values at `fractions` of the sorted `values` (empty input: zeros).
pub fn percentiles(values: &[f32], fractions: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    fractions
        .iter()
        .map(|&f| {
            let (Some(&lo), Some(&hi)) = (sorted.first(), sorted.last()) else {
                return 0.0;
            };
            if f <= 0.0 {
                return f64::from(lo);
            }
            if f >= 1.0 {
                return f64::from(hi);
            }
            let p = f * (sorted.len() - 1) as f64;
            let i = p as usize;
            let t = p - i as f64;
            let next = sorted[(i + 1).min(sorted.len() - 1)];
            (1.0 - t) * f64::from(sorted[i]) + t * f64::from(next)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_a_uniform_distribution_is_ln_n() {
        let logits = [3.0f32; 8];
        assert!((nll(&logits, 5) - 8f64.ln()).abs() < 1e-6);
    }

    #[test]
    fn nll_matches_the_softmax() {
        let logits = [1.0f32, 2.0, 0.5, -1.0];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let expected = -(f64::from(logits[1]).exp() / z).ln();
        assert!((nll(&logits, 1) - expected).abs() < 1e-6);
    }

    #[test]
    fn perplexity_and_its_error() {
        let mut s = NllStats::default();
        for v in [1.0, 2.0, 3.0, 2.0] {
            s.add(v);
        }
        assert_eq!(s.count(), 4);
        assert!((s.ppl() - 2f64.exp()).abs() < 1e-12);
        // Population variance 0.5; error of the mean √(0.5/3), times PPL.
        let expected = (0.5f64 / 3.0).sqrt() * 2f64.exp();
        assert!((s.ppl_error().unwrap() - expected).abs() < 1e-12);
        let mut flat = NllStats::default();
        flat.add(1.0);
        flat.add(1.0);
        assert_eq!(flat.ppl_error(), None);
    }

    #[test]
    fn percentiles_interpolate() {
        let v = [4.0f32, 1.0, 3.0, 2.0];
        let p = percentiles(&v, &[0.0, 0.5, 1.0, 1.0 / 3.0]);
        assert_eq!(p[0], 1.0);
        assert_eq!(p[1], 2.5);
        assert_eq!(p[2], 4.0);
        assert!((p[3] - 2.0).abs() < 1e-12);
        assert_eq!(percentiles(&[], &[0.5]), [0.0]);
    }
}
