//! Choosing the next token from the model's logits.
//!
//! The chain is llama.cpp's default order: penalties → top-k → top-p → min-p →
//! temperature → a draw from the softmax. `temperature <= 0` means greedy: the highest
//! logit after penalties, ties going to the lowest id. The random draw uses ChaCha8
//! seeded from [`SamplerConfig::seed`], so one seed gives the same text on every
//! platform.
//!
//! Not here: grammars, logit bias, Mirostat.

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings; each filter has a value that switches it off.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Divides the logits; `<= 0` is greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p`; 1 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; 0 = off.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of recent tokens; 1 = off.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of any recent token; 0 = off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a recent token; 0 = off.
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0x5EED,
        }
    }
}

#[derive(Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
    p: f32,
}

/// A sampler with its own history of accepted tokens and RNG.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: ChaCha8Rng,
    history: VecDeque<u32>,
    /// Occurrences of each token in `history`.
    counts: HashMap<u32, u32>,
    /// Reused between calls so sampling does not allocate.
    candidates: Vec<Candidate>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            history: VecDeque::with_capacity(cfg.repeat_last_n),
            counts: HashMap::new(),
            candidates: Vec::new(),
            cfg,
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Records a token as part of the text (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.history.len() == self.cfg.repeat_last_n {
            if let Some(old) = self.history.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.history.push_back(token);
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Forgets the history and restarts the RNG from the seed.
    pub fn reset(&mut self) {
        self.history.clear();
        self.counts.clear();
        self.rng = ChaCha8Rng::seed_from_u64(self.cfg.seed);
    }

    /// Picks the next token. Does not [`accept`](Sampler::accept) it.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if let Some(id) = self.filter(logits) {
            return id;
        }
        let r: f32 = self.rng.gen();
        draw(self.candidates.iter().map(|c| (c.id, c.p)), r)
    }

    /// Whether [`sample`](Sampler::sample) takes the highest logit (`temperature <= 0`).
    pub fn is_greedy(&self) -> bool {
        self.cfg.temperature <= 0.0
    }

    /// The distribution [`sample`](Sampler::sample) would draw from, into `out`: every
    /// token that survives the penalties and filters with its probability (they sum to
    /// 1), the most likely first. Greedy: the one token it would pick, with probability 1.
    /// Uses no randomness.
    pub fn distribution(&mut self, logits: &[f32], out: &mut Vec<TokenProb>) {
        out.clear();
        match self.filter(logits) {
            Some(id) => out.push(TokenProb { id, p: 1.0 }),
            None => out.extend(
                self.candidates
                    .iter()
                    .map(|c| TokenProb { id: c.id, p: c.p }),
            ),
        }
    }

    /// A uniform draw in [0, 1) from this sampler's seeded RNG.
    pub fn uniform(&mut self) -> f32 {
        self.rng.gen()
    }

    /// Draws one token from `weights` (not necessarily normalized: a draw in
    /// [0, total)), with this sampler's RNG. The last token when rounding leaves the
    /// draw past the end. `None` when `weights` is empty.
    pub fn draw_from(&mut self, weights: &[TokenProb]) -> Option<u32> {
        let total: f32 = weights.iter().map(|t| t.p).sum();
        weights.last()?;
        let r = self.uniform() * total;
        Some(draw(weights.iter().map(|t| (t.id, t.p)), r))
    }

    /// Takes the penalties' history (the recent tokens) from `other`, keeping this
    /// sampler's configuration and RNG: a draft model's sampler follows the text the
    /// target's has accepted.
    pub fn copy_history_from(&mut self, other: &Sampler) {
        self.history.clone_from(&other.history);
        self.counts.clone_from(&other.counts);
    }

    /// Applies the penalties and filters to `logits`: `Some(id)` when greedy, else the
    /// survivors are left in `candidates` with their probabilities.
    fn filter(&mut self, logits: &[f32]) -> Option<u32> {
        assert!(!logits.is_empty(), "sample() needs at least one logit");
        let cfg = &self.cfg;
        let penalize = cfg.repeat_penalty != 1.0
            || cfg.presence_penalty != 0.0
            || cfg.frequency_penalty != 0.0;
        if cfg.temperature <= 0.0 && !penalize {
            // Greedy as is: no candidate list (a copy of the whole vocabulary per token).
            return Some(argmax_logits(logits));
        }
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(logits.iter().enumerate().map(|(i, &logit)| Candidate {
            id: i as u32,
            logit,
            p: 0.0,
        }));

        // Penalties.
        if penalize {
            for (&tok, &n) in &self.counts {
                let Some(c) = cands.get_mut(tok as usize) else {
                    continue;
                };
                if c.logit > 0.0 {
                    c.logit /= cfg.repeat_penalty;
                } else {
                    c.logit *= cfg.repeat_penalty;
                }
                c.logit -= n as f32 * cfg.frequency_penalty + cfg.presence_penalty;
            }
        }

        if cfg.temperature <= 0.0 {
            return Some(argmax(cands.iter().map(|c| (c.id, c.logit))));
        }

        // Top-k: a partial sort puts the k best first, then those k are sorted.
        let k = if cfg.top_k == 0 {
            cands.len()
        } else {
            cfg.top_k.min(cands.len())
        };
        let by_logit =
            |a: &Candidate, b: &Candidate| b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id));
        if k < cands.len() {
            cands.select_nth_unstable_by(k - 1, by_logit);
            cands.truncate(k);
        }
        cands.sort_unstable_by(by_logit);

        // Top-p over the softmax of the (sorted) survivors.
        if cfg.top_p < 1.0 {
            softmax(cands, 1.0);
            let mut cum = 0.0f32;
            let mut keep = cands.len();
            for (i, c) in cands.iter().enumerate() {
                cum += c.p;
                if cum >= cfg.top_p {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }

        // Min-p relative to the best survivor, on logits: p_i/p_max = exp(l_i - l_max).
        if cfg.min_p > 0.0 {
            let threshold = cands[0].logit + cfg.min_p.ln();
            let keep = cands.iter().take_while(|c| c.logit >= threshold).count();
            cands.truncate(keep.max(1));
        }

        softmax(cands, cfg.temperature);
        None
    }
}

/// One token of a sampling distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenProb {
    pub id: u32,
    pub p: f32,
}

/// The token where the running sum of `weights` first passes `r`; the last one when it
/// never does (rounding).
fn draw(weights: impl Iterator<Item = (u32, f32)>, r: f32) -> u32 {
    let mut cum = 0.0f32;
    let mut last = 0;
    for (id, p) in weights {
        cum += p;
        if r < cum {
            return id;
        }
        last = id;
    }
    last
}

/// Highest logit, ties going to the lowest id.
/// The id of the first highest logit of `(id, logit)` pairs (a NaN never wins; a NaN
/// first, nothing beats it). Not empty.
fn argmax(mut cands: impl Iterator<Item = (u32, f32)>) -> u32 {
    let mut best = cands.next().expect("argmax of no candidates");
    for c in cands {
        if c.1 > best.1 {
            best = c;
        }
    }
    best.0
}

/// The greedy pick (`argmax`) of `logits` by index, the same pick (the first of the largest; a NaN never,
/// unless it comes first), in vector-wide passes: the largest value in sixteen lanes, then
/// the first index that holds it. The scalar loop waits on each compare (~47 µs for
/// SmolLM2's 49 152 logits), once per request and token.
pub fn argmax_logits(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let first = *logits.first().expect("argmax of no candidates");
    if first.is_nan() {
        // Nothing is larger than a NaN: the scalar loop keeps it.
        return 0;
    }
    let mut lanes = [first; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &l) in lanes.iter_mut().zip(c) {
            // `>`, so a NaN never wins (as in the scalar loop).
            *m = if l > *m { l } else { *m };
        }
    }
    let mut max = first;
    for &l in lanes.iter().chain(tail) {
        if l > max {
            max = l;
        }
    }
    // The first index holding the largest value (ties, and ±0, go to the lowest index, as
    // the scalar loop, which replaces only on strictly larger).
    let mut base = 0;
    for c in logits.chunks(LANES) {
        if c.iter().fold(false, |any, &l| any | (l == max)) {
            let i = c.iter().position(|&l| l == max).expect("a lane equals it");
            return (base + i) as u32;
        }
        base += c.len();
    }
    unreachable!("the largest value is one of the logits")
}

/// Fills `p` with softmax(logit / temperature).
fn softmax(cands: &mut [Candidate], temperature: f32) {
    let max = cands
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for c in cands.iter_mut() {
        c.p = ((c.logit - max) / temperature).exp();
        sum += c.p;
    }
    for c in cands.iter_mut() {
        c.p /= sum;
    }
}

#[cfg(test)]
mod tests;
