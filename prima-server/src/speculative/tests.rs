//! The drafting scheduler over toy models of several slots: each request's greedy text
//! is the one the plain scheduler gives, whatever the draft proposes, with requests
//! joining and leaving (by length, stop strings, end of generation) between steps.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::job::{Completion, FinishReason, GenerationRequest, Prompt};
use crate::queue::testing::{letters, outcomes};
use crate::queue::{job_queue, Submitted};
use crate::scheduler::run_scheduler;
use prima_core::sampler::SamplerConfig;

const N_VOCAB: usize = 27;

/// `n_slots` contexts of a model whose logits after a context are a pseudo-random
/// function of all of it (so a cache cut back wrongly shows), peaked on one token; `salt`
/// and `noise` make a draft that agrees with the target on most positions, not all.
struct Toys {
    salt: u64,
    noise: f32,
    n_ctx: usize,
    n_batch: usize,
    contexts: Vec<Vec<u32>>,
    out: Vec<f32>,
    /// Every batch: (slot, tokens, rows with logits) per entry.
    batches: Vec<Vec<(usize, usize, usize)>>,
}

impl Toys {
    fn new(n_slots: usize, salt: u64, noise: f32) -> Toys {
        Toys {
            salt,
            noise,
            n_ctx: 256,
            n_batch: 64,
            contexts: vec![Vec::new(); n_slots],
            out: Vec::new(),
            batches: Vec::new(),
        }
    }

    fn logits_after(&self, prefix: &[u32], out: &mut [f32]) {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &t in prefix {
            h = (h ^ t as u64).wrapping_mul(0x100_0000_01b3);
        }
        let mut base = ChaCha8Rng::seed_from_u64(h);
        let mut noise = ChaCha8Rng::seed_from_u64(h ^ self.salt);
        for (i, l) in out.iter_mut().enumerate() {
            *l = base.gen_range(-2.0..2.0) + self.noise * noise.gen_range(-1.5f32..1.5);
            if i == 0 {
                // End of text now and then.
                *l -= 2.0;
            }
        }
        let peak = base.gen_range(1..N_VOCAB);
        out[peak] += 2.5;
    }
}

impl BatchForward for Toys {
    type Error = std::io::Error;

    fn n_slots(&self) -> usize {
        self.contexts.len()
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn n_batch(&self) -> usize {
        self.n_batch
    }

    fn n_vocab(&self) -> usize {
        N_VOCAB
    }

    fn n_past(&self, slot: usize) -> usize {
        self.contexts[slot].len()
    }

    fn truncate(&mut self, slot: usize, n: usize) -> Result<(), std::io::Error> {
        self.contexts[slot].truncate(n);
        Ok(())
    }

    fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], std::io::Error> {
        let rows = vec![1; seqs.len()];
        self.eval_batch_rows(seqs, &rows)
    }
}

impl BatchRowLogits for Toys {
    fn eval_batch_rows(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<&[f32], std::io::Error> {
        prima_core::batch::check_entries(seqs, self.contexts.len(), self.n_ctx, |s| {
            self.contexts[s].len()
        })
        .and_then(|()| prima_core::batch::check_rows(seqs, rows))
        .map_err(std::io::Error::other)?;
        self.out.clear();
        let mut batch = Vec::new();
        for (seq, &n) in seqs.iter().zip(rows) {
            batch.push((seq.slot, seq.tokens.len(), n));
            self.contexts[seq.slot].extend_from_slice(seq.tokens);
            let context = self.contexts[seq.slot].clone();
            for end in context.len() - n + 1..=context.len() {
                let mut row = vec![0.0; N_VOCAB];
                self.logits_after(&context[..end], &mut row);
                self.out.extend_from_slice(&row);
            }
        }
        self.batches.push(batch);
        Ok(&self.out)
    }
}

fn request(prompt: &str, max_tokens: usize, temperature: f32) -> GenerationRequest {
    GenerationRequest {
        prompt: Prompt::Text(prompt.into()),
        max_tokens: Some(max_tokens),
        sampler: SamplerConfig {
            temperature,
            seed: 7,
            ..SamplerConfig::default()
        },
        stop: Vec::new(),
        ignore_eos: false,
    }
}

/// Serves `requests`, all queued at once, with `n_slots` slots: by the plain scheduler,
/// or drafting with `draft`.
fn serve(
    n_slots: usize,
    draft: Option<(&mut Toys, DraftOptions)>,
    requests: &[GenerationRequest],
) -> (Vec<(String, Completion)>, Toys) {
    let tok = letters();
    let (queue, jobs) = job_queue();
    let submitted: Vec<Submitted> = requests
        .iter()
        .map(|r| queue.submit(r.clone()).unwrap())
        .collect();
    drop(queue);
    let mut target = Toys::new(n_slots, 0, 0.0);
    let options = SchedulerOptions { prefill_chunk: 4 };
    match draft {
        Some((draft, options_d)) => run_speculative_scheduler(
            Drafting {
                target: &mut target,
                draft,
                options: options_d,
            },
            &tok,
            jobs,
            options,
            |_| {},
        ),
        None => run_scheduler(&mut target, &tok, jobs, options, |_| {}),
    }
    (outcomes(submitted), target)
}

fn requests(temperature: f32) -> Vec<GenerationRequest> {
    let mut stopped = request("hello", 40, temperature);
    stopped.stop = vec!["q".into()];
    let mut endless = request("zebra", 30, temperature);
    endless.ignore_eos = true;
    vec![
        request("abc", 20, temperature),
        request("thequickbrownfox", 3, temperature),
        endless,
        stopped,
        request("mnopq", 1, temperature),
        request("abcdefghijklm", 25, temperature),
    ]
}

fn draft_options(max: usize) -> DraftOptions {
    DraftOptions { max, p_min: 0.0 }
}

#[test]
fn greedy_slots_with_a_draft_give_the_text_of_the_plain_scheduler() {
    let requests = requests(0.0);
    let (plain, _) = serve(3, None, &requests);
    // A draft that is often wrong: rejections mid-draft in some slots while others
    // accept all of theirs.
    let mut draft = Toys::new(3, 99, 0.8);
    let (drafted, target) = serve(3, Some((&mut draft, draft_options(4))), &requests);
    for (i, ((p, pc), (d, dc))) in plain.iter().zip(&drafted).enumerate() {
        assert_eq!(d, p, "request {i}: greedy text with a draft differs");
        assert_eq!(dc.finish_reason, pc.finish_reason, "request {i}");
        assert_eq!(dc.usage, pc.usage, "request {i}");
    }
    let stats: Vec<_> = drafted.iter().filter_map(|(_, c)| c.draft).collect();
    let proposed: usize = stats.iter().map(|s| s.drafted).sum();
    let accepted: usize = stats.iter().map(|s| s.accepted).sum();
    assert!(
        accepted > 0 && accepted < proposed,
        "{accepted} of {proposed}"
    );
    // Several slots verified several rows in one batch.
    assert!(
        target
            .batches
            .iter()
            .any(|b| b.iter().filter(|&&(_, _, rows)| rows > 1).count() > 1),
        "{:?}",
        target.batches
    );
}

#[test]
fn a_perfect_draft_verifies_each_slots_tokens_in_few_batches() {
    let requests = requests(0.0);
    let (plain, plain_target) = serve(2, None, &requests);
    let mut draft = Toys::new(2, 0, 0.0);
    let (drafted, target) = serve(2, Some((&mut draft, draft_options(8))), &requests);
    for ((p, _), (d, _)) in plain.iter().zip(&drafted) {
        assert_eq!(d, p);
    }
    // Every draft is accepted, but for those after a stop string or end of generation.
    for (_, c) in &drafted {
        if let (Some(s), FinishReason::Length) = (c.draft, c.finish_reason) {
            assert_eq!(s.accepted, s.drafted, "{s:?}");
        }
    }
    assert!(target.batches.len() * 2 < plain_target.batches.len());
    // A slot that leaves mid-step (its length, a stop string) leaves its cache holding
    // only text it kept: the target's and the draft's caches agree with what was kept.
    for (slot, context) in target.contexts.iter().enumerate() {
        assert!(
            draft.contexts[slot].len() <= context.len()
                && context.starts_with(&draft.contexts[slot]),
            "slot {slot}"
        );
    }
}

#[test]
fn a_seed_gives_one_sampled_text_in_each_slot() {
    let requests = requests(0.9);
    let run = || {
        let mut draft = Toys::new(3, 99, 0.5);
        serve(3, Some((&mut draft, draft_options(4))), &requests).0
    };
    let (a, b) = (run(), run());
    for (i, (((ta, ca), (tb, _)), r)) in a.iter().zip(&b).zip(&requests).enumerate() {
        assert_eq!(ta, tb, "request {i}");
        let max = r.max_tokens.unwrap();
        assert!(ca.usage.completion_tokens <= max, "request {i}");
        if ca.finish_reason == FinishReason::Length {
            assert_eq!(ca.usage.completion_tokens, max, "request {i}");
        }
        assert!(ta.chars().all(|c| c.is_ascii_lowercase()), "{ta:?}");
    }
}
