//! Perplexity of a text and KL divergence from reference log-probabilities, computed as
//! llama.cpp's `llama-perplexity` computes them, so the figures of the two compare:
//!
//! - the whole text is tokenized once (BOS first when the model asks for it);
//! - it is cut into `n_chunk = ⌊tokens / n_ctx⌋` chunks of `n_ctx` tokens (the rest is
//!   dropped), each evaluated from an empty context, its first token replaced by BOS
//!   when the model asks for BOS;
//! - only the second half of each chunk is scored: the positions `n_ctx/2 … n_ctx − 2`
//!   each predict the token after them, so every scored token has at least `n_ctx/2`
//!   tokens of context (`n_ctx − 1 − n_ctx/2` tokens per chunk);
//! - PPL = exp(mean NLL), its error PPL · σ(NLL)/√(N − 1) ([`stats::NllStats`]).
//!
//! Evaluation goes through [`RowLogits`], so one device ([`Session`](crate::model::Session),
//! `LocalSession` (prima-cluster)) and a ring head
//! (`RingHead`, prima-cluster) score alike. Not for: llama-perplexity's strided
//! mode (`--ppl-stride`), HellaSwag, WinoGrande and multiple-choice scores.

pub mod logits_file;
pub mod stats;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::generate::RowLogits;
use logits_file::{LogitsFileError, LogitsReader, LogitsWriter};
use stats::{KldStats, NllStats};

/// Rows whose logits are computed in one output-head product: the head's weights are
/// read once per group instead of once per row, and the buffer stays small even for a
/// 262 144-token vocabulary (32 MiB).
const ROWS_AT_ONCE: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    #[error("the context of {n_ctx} tokens is too short: at least 4, so a chunk's second half scores a token")]
    ContextTooShort { n_ctx: usize },
    #[error("the text has {tokens} tokens, but a context of {n_ctx} needs at least {} (two chunks)", 2 * n_ctx)]
    TooFewTokens { tokens: usize, n_ctx: usize },
    #[error(
        "the reference logits were computed over a vocabulary of {file}, the model has {model}"
    )]
    VocabularyMismatch { file: usize, model: usize },
    #[error("reference logits: {0}")]
    LogitsFile(#[from] LogitsFileError),
    #[error("writing the reference logits: {0}")]
    Write(#[from] std::io::Error),
    #[error(transparent)]
    Forward(Box<dyn std::error::Error + Send + Sync>),
}

/// How the tokens are cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunking {
    pub n_ctx: usize,
    pub n_chunk: usize,
}

impl Chunking {
    /// As many whole chunks of `n_ctx` as `n_tokens` holds, at most `max_chunks`.
    pub fn new(
        n_tokens: usize,
        n_ctx: usize,
        max_chunks: Option<usize>,
    ) -> Result<Chunking, PerplexityError> {
        if n_ctx < 4 {
            return Err(PerplexityError::ContextTooShort { n_ctx });
        }
        if n_tokens < 2 * n_ctx {
            return Err(PerplexityError::TooFewTokens {
                tokens: n_tokens,
                n_ctx,
            });
        }
        let n_chunk = (n_tokens / n_ctx).min(max_chunks.unwrap_or(usize::MAX));
        Ok(Chunking { n_ctx, n_chunk })
    }

    /// The first scored position of a chunk.
    pub fn first(&self) -> usize {
        self.n_ctx / 2
    }

    /// Tokens scored per chunk.
    pub fn scored_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.first()
    }

    /// The tokens of chunk `i`.
    pub fn chunk<'t>(&self, tokens: &'t [u32], i: usize) -> &'t [u32] {
        &tokens[i * self.n_ctx..(i + 1) * self.n_ctx]
    }
}

/// Evaluates chunks and hands out the logits of their scored positions; owns the buffers.
pub struct ChunkScorer {
    n_vocab: usize,
    /// BOS, when the model asks for it: it replaces each chunk's first token.
    bos: Option<u32>,
    chunk: Vec<u32>,
    rows: Vec<f32>,
}

impl ChunkScorer {
    pub fn new(n_vocab: usize, bos: Option<u32>) -> ChunkScorer {
        ChunkScorer {
            n_vocab,
            bos,
            chunk: Vec::new(),
            rows: vec![0.0; ROWS_AT_ONCE * n_vocab],
        }
    }

    /// Evaluates `tokens` (one chunk) from an empty context and calls `on_row` with the
    /// logits of each scored position and the token that came next, in order.
    pub fn score<F: RowLogits>(
        &mut self,
        forward: &mut F,
        tokens: &[u32],
        mut on_row: impl FnMut(&[f32], u32) -> Result<(), PerplexityError>,
    ) -> Result<(), PerplexityError> {
        let fwd = |e: F::Error| PerplexityError::Forward(Box::new(e));
        let n_ctx = tokens.len();
        let (first, last) = (n_ctx / 2, n_ctx - 1);
        self.chunk.clear();
        self.chunk.extend_from_slice(tokens);
        if let (Some(bos), Some(t0)) = (self.bos, self.chunk.first_mut()) {
            *t0 = bos;
        }
        forward.truncate(0).map_err(fwd)?;
        let n_batch = forward.n_batch().max(1);
        for (b, batch) in self.chunk.chunks(n_batch).enumerate() {
            let start = b * n_batch;
            forward.eval(batch).map_err(fwd)?;
            // Scored positions in this batch, a group of rows at a time.
            let mut pos = first.max(start);
            let end = last.min(start + batch.len());
            while pos < end {
                let n = (end - pos).min(ROWS_AT_ONCE);
                let rows = &mut self.rows[..n * self.n_vocab];
                forward
                    .row_logits(pos - start..pos - start + n, rows)
                    .map_err(fwd)?;
                for (j, logits) in rows.chunks_exact(self.n_vocab).enumerate() {
                    on_row(logits, tokens[pos + j + 1])?;
                }
                pos += n;
            }
        }
        Ok(())
    }
}

/// Where the running estimate stands after a chunk.
#[derive(Debug, Clone, Copy)]
pub struct ChunkReport<'s, S> {
    /// 1-based, as llama-perplexity prints it.
    pub chunk: usize,
    pub n_chunk: usize,
    /// Statistics over every chunk so far.
    pub stats: &'s S,
    /// Evaluating and scoring this chunk.
    pub elapsed: Duration,
}

/// The perplexity of `tokens` under `forward`; with `base`, every scored row's
/// log-probabilities are also saved there (a KL-divergence reference).
pub fn perplexity<F: RowLogits, W: Write>(
    forward: &mut F,
    n_vocab: usize,
    bos: Option<u32>,
    tokens: &[u32],
    chunking: Chunking,
    mut base: Option<&mut LogitsWriter<W>>,
    mut on_chunk: impl FnMut(ChunkReport<'_, NllStats>),
) -> Result<NllStats, PerplexityError> {
    let mut scorer = ChunkScorer::new(n_vocab, bos);
    let mut stats = NllStats::default();
    for i in 0..chunking.n_chunk {
        let started = Instant::now();
        scorer.score(forward, chunking.chunk(tokens, i), |logits, next| {
            let nll = match base.as_deref_mut() {
                Some(writer) => writer.write_row(logits, next)?,
                None => stats::nll(logits, next),
            };
            stats.add(nll);
            Ok(())
        })?;
        on_chunk(ChunkReport {
            chunk: i + 1,
            n_chunk: chunking.n_chunk,
            stats: &stats,
            elapsed: started.elapsed(),
        });
    }
    Ok(stats)
}

/// Compares `forward` with the reference log-probabilities `reference` holds, on the
/// reference's own tokens and chunks.
pub fn kl_divergence<F: RowLogits, R: Read>(
    forward: &mut F,
    n_vocab: usize,
    bos: Option<u32>,
    reference: &mut LogitsReader<R>,
    mut on_chunk: impl FnMut(ChunkReport<'_, KldStats>),
) -> Result<KldStats, PerplexityError> {
    let header = reference.header().clone();
    if header.n_vocab != n_vocab {
        return Err(PerplexityError::VocabularyMismatch {
            file: header.n_vocab,
            model: n_vocab,
        });
    }
    let chunking = Chunking {
        n_ctx: header.n_ctx,
        n_chunk: header.n_chunk,
    };
    let mut scorer = ChunkScorer::new(n_vocab, bos);
    let mut stats = KldStats::default();
    for i in 0..chunking.n_chunk {
        let started = Instant::now();
        scorer.score(
            forward,
            chunking.chunk(&header.tokens, i),
            |logits, next| {
                let base = reference.next_row()?;
                stats.add(logits, &base, next);
                Ok(())
            },
        )?;
        on_chunk(ChunkReport {
            chunk: i + 1,
            n_chunk: chunking.n_chunk,
            stats: &stats,
            elapsed: started.elapsed(),
        });
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::Forward;

    /// A model whose logits at each position favour `position + 1`, and which records
    /// what it was asked.
    struct Counting {
        n_vocab: usize,
        n_batch: usize,
        n_past: usize,
        last_batch: Vec<u32>,
        seen: Vec<Vec<u32>>,
        last: Vec<f32>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    impl Forward for Counting {
        type Error = Never;
        fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], Never> {
            assert!(tokens.len() <= self.n_batch);
            self.seen.push(tokens.to_vec());
            self.last_batch = tokens.to_vec();
            self.n_past += tokens.len();
            Ok(&self.last)
        }
        fn n_past(&self) -> usize {
            self.n_past
        }
        fn n_ctx(&self) -> usize {
            usize::MAX
        }
        fn truncate(&mut self, n: usize) -> Result<(), Never> {
            self.n_past = n;
            Ok(())
        }
    }

    impl RowLogits for Counting {
        fn n_batch(&self) -> usize {
            self.n_batch
        }
        fn row_logits(
            &mut self,
            rows: std::ops::Range<usize>,
            out: &mut [f32],
        ) -> Result<(), Never> {
            let start = self.n_past - self.last_batch.len();
            for (r, row) in rows.zip(out.chunks_exact_mut(self.n_vocab)) {
                row.fill(0.0);
                row[(start + r + 1) % self.n_vocab] = 10.0;
            }
            Ok(())
        }
    }

    fn counting(n_batch: usize) -> Counting {
        Counting {
            n_vocab: 64,
            n_batch,
            n_past: 0,
            last_batch: Vec::new(),
            seen: Vec::new(),
            last: Vec::new(),
        }
    }

    #[test]
    fn chunks_are_whole_and_at_least_two() {
        assert_eq!(
            Chunking::new(100, 16, None).unwrap(),
            Chunking {
                n_ctx: 16,
                n_chunk: 6
            }
        );
        assert_eq!(Chunking::new(100, 16, Some(2)).unwrap().n_chunk, 2);
        assert!(matches!(
            Chunking::new(31, 16, None),
            Err(PerplexityError::TooFewTokens {
                tokens: 31,
                n_ctx: 16
            })
        ));
        assert!(matches!(
            Chunking::new(100, 3, None),
            Err(PerplexityError::ContextTooShort { n_ctx: 3 })
        ));
        let c = Chunking::new(100, 16, None).unwrap();
        assert_eq!((c.first(), c.scored_per_chunk()), (8, 7));
        let odd = Chunking::new(100, 15, None).unwrap();
        assert_eq!((odd.first(), odd.scored_per_chunk()), (7, 7));
    }

    /// Scored rows are the second half less the last, each paired with the token after
    /// it; BOS replaces each chunk's first token; batches never exceed n_batch.
    #[test]
    fn scores_the_second_half_of_each_chunk() {
        for n_batch in [3, 5, 16, 64] {
            let mut fwd = counting(n_batch);
            let tokens: Vec<u32> = (0..40).map(|i| i % 64).collect();
            let chunking = Chunking::new(tokens.len(), 16, None).unwrap();
            let mut scorer = ChunkScorer::new(64, Some(63));
            let mut rows = Vec::new();
            for i in 0..chunking.n_chunk {
                let chunk = chunking.chunk(&tokens, i);
                scorer
                    .score(&mut fwd, chunk, |logits, next| {
                        let argmax = logits.iter().position(|&l| l == 10.0).unwrap();
                        rows.push((argmax as u32, next));
                        Ok(())
                    })
                    .unwrap();
            }
            // Two chunks of 16: positions 8..=14 predict tokens 9..=15 of each.
            let expected: Vec<(u32, u32)> = (0..2)
                .flat_map(|c| (8..15).map(move |p| ((p + 1) as u32, (16 * c + p + 1) as u32)))
                .collect();
            assert_eq!(rows, expected, "n_batch {n_batch}");
            let evaluated: Vec<u32> = fwd.seen.concat();
            assert_eq!(evaluated.len(), 32);
            assert_eq!((evaluated[0], evaluated[16]), (63, 63));
            assert_eq!(&evaluated[1..16], &tokens[1..16]);
            assert!(fwd.seen.iter().all(|b| b.len() <= n_batch));
        }
    }

    /// The perplexity of a model that always puts the same weight on the right token is
    /// the same whatever the chunking, and the base file's NLLs equal the plain ones up to
    /// the f32 rounding of the stored form.
    #[test]
    fn perplexity_with_and_without_a_reference_file() {
        // Every chunk counts 0..16, so the favoured token is always the next one.
        let tokens: Vec<u32> = (0..48).map(|i| i % 16).collect();
        let chunking = Chunking::new(tokens.len(), 16, None).unwrap();
        let mut fwd = counting(16);
        let plain =
            perplexity::<_, Vec<u8>>(&mut fwd, 64, None, &tokens, chunking, None, |_| {}).unwrap();
        // softmax of one 10 among 63 zeros.
        let p = 10f64.exp() / (10f64.exp() + 63.0);
        assert!((plain.ppl() - 1.0 / p).abs() < 1e-6);
        assert_eq!(plain.count(), 3 * 7);

        let mut writer = LogitsWriter::new(Vec::new(), 16, 64, &tokens).unwrap();
        let mut reports = Vec::new();
        let saved = perplexity(
            &mut counting(16),
            64,
            None,
            &tokens,
            chunking,
            Some(&mut writer),
            |r| reports.push((r.chunk, r.stats.count())),
        )
        .unwrap();
        assert_eq!(reports, [(1, 7), (2, 14), (3, 21)]);
        assert!((saved.ppl() - plain.ppl()).abs() < 1e-5);

        // The same model against its own reference: no divergence, same top token.
        let bytes = writer.finish().unwrap();
        let mut reader = LogitsReader::new(&bytes[..]).unwrap();
        let kld = kl_divergence(&mut counting(16), 64, None, &mut reader, |_| {}).unwrap();
        assert_eq!(kld.count(), 21);
        assert!(kld.kld().value.abs() < 1e-6, "{:?}", kld.kld());
        assert_eq!(kld.same_top().value, 1.0);
        assert!((kld.ppl_ratio().value - 1.0).abs() < 1e-4);
        assert!(matches!(
            kl_divergence(
                &mut counting(16),
                65,
                None,
                &mut LogitsReader::new(&bytes[..]).unwrap(),
                |_| {}
            ),
            Err(PerplexityError::VocabularyMismatch {
                file: 64,
                model: 65
            })
        ));
    }
}
