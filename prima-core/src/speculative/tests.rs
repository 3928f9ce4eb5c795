use super::*;
use crate::generate::generate;
use crate::tokenizer::{letters, TokenizerParts};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const N_VOCAB: usize = 27;

/// A model whose logits at a position are a pseudo-random function of every token before
/// it (so a context cut back wrongly gives other logits), peaked on one token; `salt`
/// makes a draft that agrees with the target on most positions, not all.
struct Toy {
    salt: u64,
    /// How much of the salted noise is added (0: the target itself).
    noise: f32,
    n_ctx: usize,
    context: Vec<u32>,
    /// Logits of every row of the last batch.
    rows: Vec<f32>,
    batch_len: usize,
    evals: usize,
}

impl Toy {
    fn new(salt: u64, noise: f32) -> Toy {
        Toy {
            salt,
            noise,
            n_ctx: 512,
            context: Vec::new(),
            rows: Vec::new(),
            batch_len: 0,
            evals: 0,
        }
    }

    fn logits_after(&self, prefix: &[u32], out: &mut [f32]) {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &t in prefix {
            h = (h ^ t as u64).wrapping_mul(0x100_0000_01b3);
        }
        let mut base = ChaCha8Rng::seed_from_u64(h);
        let mut noise = ChaCha8Rng::seed_from_u64(h ^ self.salt);
        // End of text only now and then.
        for (i, l) in out.iter_mut().enumerate() {
            *l = base.gen_range(-2.0..2.0) + self.noise * noise.gen_range(-1.5f32..1.5);
            if i == 0 {
                *l -= 3.0;
            }
        }
        let peak = base.gen_range(1..N_VOCAB);
        out[peak] += 2.5;
    }
}

impl Forward for Toy {
    type Error = std::io::Error;

    fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], std::io::Error> {
        if tokens.is_empty() || self.context.len() + tokens.len() > self.n_ctx {
            return Err(std::io::Error::other("bad batch"));
        }
        self.evals += 1;
        let start = self.context.len();
        self.context.extend_from_slice(tokens);
        let mut rows = vec![0.0; tokens.len() * N_VOCAB];
        for (i, row) in rows.chunks_mut(N_VOCAB).enumerate() {
            self.logits_after(&self.context[..start + i + 1], row);
        }
        self.rows = rows;
        self.batch_len = tokens.len();
        Ok(&self.rows[(tokens.len() - 1) * N_VOCAB..])
    }

    fn n_past(&self) -> usize {
        self.context.len()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn truncate(&mut self, n: usize) -> Result<(), std::io::Error> {
        self.context.truncate(n);
        Ok(())
    }
}

impl RowLogits for Toy {
    fn n_batch(&self) -> usize {
        64
    }

    fn row_logits(
        &mut self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), std::io::Error> {
        if rows.end > self.batch_len || out.len() != rows.len() * N_VOCAB {
            return Err(std::io::Error::other("rows out of the batch"));
        }
        out.copy_from_slice(&self.rows[rows.start * N_VOCAB..rows.end * N_VOCAB]);
        Ok(())
    }
}

fn greedy_config() -> SamplerConfig {
    SamplerConfig {
        temperature: 0.0,
        ..SamplerConfig::default()
    }
}

fn options(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        ignore_eos: true,
    }
}

fn plain(cfg: &SamplerConfig, prompt: &[u32], max_tokens: usize) -> (Vec<u32>, StopReason) {
    let tok = letters();
    let mut target = Toy::new(0, 0.0);
    let (tokens, stats) = generate(
        &mut target,
        &tok,
        &mut Sampler::new(cfg.clone()),
        prompt,
        options(max_tokens),
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    (tokens, stats.stop)
}

fn speculative(
    cfg: &SamplerConfig,
    noise: f32,
    prompt: &[u32],
    gen: GenerateOptions,
    draft_options: DraftOptions,
) -> (Vec<u32>, GenerationStats, DraftStats, String) {
    let tok = letters();
    let mut target = Toy::new(0, 0.0);
    let mut draft = Toy::new(0xABCD, noise);
    let mut text = String::new();
    let (tokens, stats, draft_stats) = generate_speculative(
        &mut target,
        &mut draft,
        &tok,
        &mut Sampler::new(cfg.clone()),
        prompt,
        gen,
        draft_options,
        |piece| {
            text.push_str(piece);
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    // Both hold a prefix of the text, the target all of it but (at most) its last token.
    let text_tokens = [prompt, &tokens[..]].concat();
    for model in [&target, &draft] {
        assert!(model.context.len() <= text_tokens.len());
        assert_eq!(model.context, text_tokens[..model.context.len()]);
    }
    if !tokens.is_empty() {
        assert!(target.n_past() + 1 >= text_tokens.len());
    }
    (tokens, stats, draft_stats, text)
}

#[test]
fn greedy_text_is_the_text_without_a_draft() {
    let prompt = [3, 1, 4, 1, 5];
    for penalties in [1.0, 1.3] {
        let cfg = SamplerConfig {
            repeat_penalty: penalties,
            ..greedy_config()
        };
        let (want, _) = plain(&cfg, &prompt, 60);
        for (noise, max, p_min) in [
            (0.0, 4, 0.0),
            (0.5, 4, 0.0),
            (1.0, 8, 0.0),
            (3.0, 3, 0.0),
            (0.5, 8, 0.3),
            (0.5, 1, 0.0),
            (0.5, 0, 0.0),
        ] {
            let draft = DraftOptions { max, p_min };
            let (got, stats, ds, text) = speculative(&cfg, noise, &prompt, options(60), draft);
            assert_eq!(got, want, "noise {noise}, draft {draft:?}");
            assert_eq!(stats.generated_tokens, 60);
            assert_eq!(stats.stop, StopReason::MaxTokens);
            assert_eq!(text, letters().decode(&want));
            assert!(ds.accepted <= ds.drafted);
            if noise == 0.0 {
                assert_eq!(ds.accepted, ds.drafted, "a draft that is the target");
            }
            if max == 0 {
                assert_eq!(ds.drafted, 0);
            }
        }
    }
}

#[test]
fn a_perfect_draft_needs_one_target_evaluation_per_round() {
    let (tokens, _, ds, _) = speculative(
        &greedy_config(),
        0.0,
        &[7, 7],
        options(41),
        DraftOptions { max: 4, p_min: 0.0 },
    );
    assert_eq!(tokens.len(), 41);
    // The first token from the prompt, then 5 tokens (4 drafted + a bonus) per round.
    assert_eq!(ds.target_evals, 8);
    assert_eq!(ds.drafted, 32);
    assert_eq!(ds.acceptance(), 1.0);
}

#[test]
fn stops_as_generate_does() {
    let tok = letters();
    // End of generation: the toy ends now and then when eos is not ignored.
    let cfg = greedy_config();
    let prompt = [2, 9];
    let mut target = Toy::new(0, 0.0);
    let (want, want_stats) = generate(
        &mut target,
        &tok,
        &mut Sampler::new(cfg.clone()),
        &prompt,
        GenerateOptions {
            max_tokens: 300,
            ignore_eos: false,
        },
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    let (got, stats, _, _) = speculative(
        &cfg,
        0.7,
        &prompt,
        GenerateOptions {
            max_tokens: 300,
            ignore_eos: false,
        },
        DraftOptions::default(),
    );
    assert_eq!(got, want);
    assert_eq!(stats.stop, want_stats.stop);

    // A full context.
    let mut target = Toy::new(0, 0.0);
    target.n_ctx = 20;
    let mut draft = Toy::new(1, 0.5);
    let (tokens, stats, _) = generate_speculative(
        &mut target,
        &mut draft,
        &tok,
        &mut Sampler::new(cfg.clone()),
        &prompt,
        options(100),
        DraftOptions::default(),
        |_| ControlFlow::Continue(()),
    )
    .unwrap();
    assert_eq!(stats.stop, StopReason::ContextFull);
    assert_eq!(tokens, plain(&cfg, &prompt, 100).0[..tokens.len()]);
    assert_eq!(prompt.len() + tokens.len(), 21);

    // Cancelled by the callback.
    let mut target = Toy::new(0, 0.0);
    let mut draft = Toy::new(1, 0.5);
    let mut pieces = 0;
    let (tokens, stats, _) = generate_speculative(
        &mut target,
        &mut draft,
        &tok,
        &mut Sampler::new(cfg.clone()),
        &prompt,
        options(100),
        DraftOptions::default(),
        |_| {
            pieces += 1;
            if pieces == 5 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    )
    .unwrap();
    assert_eq!(stats.stop, StopReason::Cancelled);
    assert_eq!(tokens.len(), 5);

    // No tokens asked for.
    let (tokens, stats, ds, _) =
        speculative(&cfg, 0.5, &prompt, options(0), DraftOptions::default());
    assert!(tokens.is_empty() && stats.generated_tokens == 0 && ds.drafted == 0);
}

#[test]
fn sampled_generation_is_deterministic_for_a_seed() {
    let cfg = |seed| SamplerConfig {
        temperature: 0.9,
        seed,
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    };
    let run = |seed| {
        speculative(
            &cfg(seed),
            0.6,
            &[5, 6],
            options(50),
            DraftOptions { max: 5, p_min: 0.0 },
        )
    };
    let (a, _, ds, _) = run(11);
    assert_eq!(a, run(11).0);
    assert_ne!(a, run(12).0);
    assert!(ds.accepted > 0 && ds.accepted < ds.drafted, "{ds:?}");
}

/// The empirical distribution of what one position emits, over `trials` draws of x ~ q.
fn emitted_frequencies(p: &[TokenProb], q: &[TokenProb], trials: usize) -> (Vec<f64>, f64) {
    let mut draw_q = ChaCha8Rng::seed_from_u64(99);
    let mut sampler = Sampler::new(SamplerConfig {
        seed: 7,
        ..SamplerConfig::default()
    });
    let mut residual = Vec::new();
    let mut counts = [0usize; 8];
    let mut accepted = 0;
    for _ in 0..trials {
        let r: f32 = draw_q.gen();
        let mut cum = 0.0;
        let x = q
            .iter()
            .find(|t| {
                cum += t.p;
                r < cum
            })
            .unwrap_or(q.last().unwrap())
            .id;
        let token = match speculative_step(x, p, q, &mut sampler, &mut residual) {
            None => {
                accepted += 1;
                x
            }
            Some(t) => t,
        };
        counts[token as usize] += 1;
    }
    let freq = counts.iter().map(|&c| c as f64 / trials as f64).collect();
    (freq, accepted as f64 / trials as f64)
}

fn dist(probs: &[(u32, f32)]) -> Vec<TokenProb> {
    probs.iter().map(|&(id, p)| TokenProb { id, p }).collect()
}

#[test]
fn the_rejection_rule_emits_tokens_distributed_as_p() {
    let cases = [
        // Overlapping supports, q more peaked than p.
        (
            dist(&[(1, 0.5), (2, 0.3), (3, 0.2)]),
            dist(&[(1, 0.8), (2, 0.1), (4, 0.1)]),
        ),
        // p has mass q never proposes (token 5), q proposes what p forbids (token 6).
        (
            dist(&[(5, 0.4), (1, 0.35), (2, 0.25)]),
            dist(&[(1, 0.5), (6, 0.3), (2, 0.2)]),
        ),
        // Disjoint: every draft is rejected, the residual is p.
        (dist(&[(1, 0.6), (2, 0.4)]), dist(&[(3, 0.7), (4, 0.3)])),
        // The same distribution: everything accepted.
        (dist(&[(1, 0.25), (2, 0.75)]), dist(&[(2, 0.75), (1, 0.25)])),
    ];
    let trials = 200_000;
    for (p, q) in &cases {
        let (freq, acceptance) = emitted_frequencies(p, q, trials);
        for (id, &f) in freq.iter().enumerate() {
            let want = p.iter().find(|t| t.id == id as u32).map_or(0.0, |t| t.p) as f64;
            assert!(
                (f - want).abs() < 0.006,
                "p {p:?}, q {q:?}: token {id} emitted {f:.4}, p = {want}"
            );
        }
        // The acceptance rate is Σ min(p, q).
        let overlap: f64 = p
            .iter()
            .map(|t| {
                let qt = q.iter().find(|u| u.id == t.id).map_or(0.0, |u| u.p);
                t.p.min(qt) as f64
            })
            .sum();
        assert!(
            (acceptance - overlap).abs() < 0.006,
            "acceptance {acceptance} vs Σ min(p, q) = {overlap}"
        );
    }
}

#[test]
fn sampled_speculation_keeps_the_target_distribution() {
    // The first generated token after the prompt comes from the target alone; the second
    // goes through the rule (drafted, verified). Over many seeds its frequencies match the
    // target's p at that position.
    let prompt = [4, 4];
    let cfg = |seed| SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplerConfig::default()
    };
    let first = plain(
        &SamplerConfig {
            temperature: 0.0,
            ..cfg(0)
        },
        &prompt,
        1,
    )
    .0[0];
    let mut counts = vec![0usize; N_VOCAB];
    let mut n = 0;
    for seed in 0..6000u64 {
        let (tokens, _, _, _) = speculative(
            &cfg(seed),
            1.5,
            &prompt,
            options(2),
            DraftOptions { max: 1, p_min: 0.0 },
        );
        // Condition on the first token being the target's most likely one.
        if tokens[0] == first {
            counts[tokens[1] as usize] += 1;
            n += 1;
        }
    }
    assert!(n > 300, "{n} runs began with token {first}");
    let mut p = vec![0.0; N_VOCAB];
    Toy::new(0, 0.0).logits_after(&[4, 4, first], &mut p);
    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = p.iter().map(|l| (l - max).exp()).sum();
    for (id, &c) in counts.iter().enumerate() {
        let want = ((p[id] - max).exp() / z) as f64;
        let got = c as f64 / n as f64;
        // A few standard errors of a frequency from n draws.
        let tolerance = 4.0 * (want * (1.0 - want) / n as f64).sqrt() + 0.01;
        assert!(
            (got - want).abs() < tolerance,
            "token {id}: {got:.3} vs p = {want:.3} over {n} runs"
        );
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let target = letters();
    assert_eq!(check_vocabularies(&target, 27, &letters(), 27), Ok(()));
    assert_eq!(
        check_vocabularies(&target, 27, &letters(), 30),
        Err(VocabularyMismatch::Size {
            target: 27,
            draft: 30
        })
    );
    let mut tokens = vec!["<|endoftext|>".to_string()];
    tokens.extend(('a'..='z').map(String::from));
    tokens[5] = "E".into();
    let mut token_types = vec![1; tokens.len()];
    token_types[0] = 3;
    let other = Tokenizer::from_parts(TokenizerParts {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types,
        add_bos: Some(false),
        ..Default::default()
    })
    .unwrap();
    let err = check_vocabularies(&target, 27, &other, 27).unwrap_err();
    assert!(
        matches!(&err, VocabularyMismatch::Token { id: 5, .. }),
        "{err}"
    );
}
