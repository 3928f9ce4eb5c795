//! `prima perplexity`: the perplexity of a text on this device or a ring, computed and
//! printed as llama.cpp's `llama-perplexity` does (see [`prima_core::perplexity`]), and
//! its KL-divergence mode against saved reference log-probabilities.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use prima_core::generate::RowLogits;
use prima_core::perplexity::logits_file::{LogitsReader, LogitsWriter};
use prima_core::perplexity::stats::{Estimate, KldStats, NllStats};
use prima_core::perplexity::{kl_divergence, perplexity, ChunkReport, Chunking};

use super::engine::{Engine, EngineArgs};
use super::run::RingArgs;

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The text to score (UTF-8). One trailing newline is dropped, as llama-perplexity
    /// does. Not needed with --kl-divergence, which scores the reference's tokens.
    #[arg(short = 'f', long = "file", required_unless_present = "kl_divergence")]
    file: Option<PathBuf>,
    /// Chunk length in tokens; the second half of each chunk is scored. With
    /// --kl-divergence the reference file's chunk length is used.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Tokens per batch (at most a chunk).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    batch_size: usize,
    /// Score the first N chunks only (default: all the text holds).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    chunks: Option<u32>,
    /// Reference log-probabilities, in llama-perplexity's format: written here by a plain
    /// run, read from here with --kl-divergence.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    kl_divergence_base: Option<PathBuf>,
    /// Compare with the reference in --kl-divergence-base: KL divergence, same top
    /// token, perplexity ratio.
    #[arg(long, requires = "kl_divergence_base")]
    kl_divergence: bool,
    #[command(flatten)]
    ring: RingArgs,
}

/// What a run computes.
enum Job {
    Perplexity {
        tokens: Vec<u32>,
        chunking: Chunking,
        base: Option<LogitsWriter<BufWriter<File>>>,
    },
    KlDivergence {
        reference: Box<LogitsReader<BufReader<File>>>,
    },
}

impl Job {
    fn n_ctx(&self) -> usize {
        match self {
            Job::Perplexity { chunking, .. } => chunking.n_ctx,
            Job::KlDivergence { reference } => reference.header().n_ctx,
        }
    }
}

pub fn run(args: PerplexityArgs) -> anyhow::Result<()> {
    let engine = Engine::open(&args.engine)?;
    let tok = &engine.tokenizer;
    let model_path = engine.path.display();
    anyhow::ensure!(
        !tok.add_eos_default(),
        "{model_path}: the model asks for EOS after every input, which scoring a text \
         cannot follow (llama-perplexity refuses such models too)"
    );
    let bos = tok.bos().filter(|_| tok.add_bos_default());
    let n_vocab = engine.model.hparams().n_vocab;

    let mut job = match (&args.kl_divergence_base, args.kl_divergence) {
        (Some(path), true) => {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            let reference = LogitsReader::new(BufReader::new(file))
                .with_context(|| format!("{}", path.display()))?;
            Job::KlDivergence {
                reference: Box::new(reference),
            }
        }
        (base, _) => {
            // clap insists on --file without --kl-divergence.
            let path = args.file.as_ref().context("--file is missing")?;
            let mut text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            if text.ends_with('\n') {
                text.pop();
            }
            eprintln!("perplexity: tokenizing the input ..");
            let started = Instant::now();
            // As llama-perplexity: BOS when the model asks for it; special-token text stays text.
            let tokens = tok.encode(&text, tok.add_bos_default(), false);
            eprintln!(
                "perplexity: tokenization took {:.3} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
            let chunking =
                Chunking::new(tokens.len(), args.ctx_size, args.chunks.map(|n| n as usize))
                    .with_context(|| format!("{}", path.display()))?;
            let base = match base {
                Some(base_path) => {
                    let file = File::create(base_path)
                        .with_context(|| format!("creating {}", base_path.display()))?;
                    eprintln!("perplexity: saving all logits to {}", base_path.display());
                    let used = &tokens[..chunking.n_chunk * chunking.n_ctx];
                    Some(LogitsWriter::new(
                        BufWriter::new(file),
                        chunking.n_ctx,
                        n_vocab,
                        used,
                    )?)
                }
                None => None,
            };
            Job::Perplexity {
                tokens,
                chunking,
                base,
            }
        }
    };

    let n_ctx = job.n_ctx();
    let n_ctx_train = engine.model.hparams().n_ctx_train;
    if n_ctx > n_ctx_train {
        eprintln!(
            "warning: {model_path} was trained on only {n_ctx_train} context tokens ({n_ctx} asked)"
        );
    }
    let n_batch = args.batch_size.clamp(1, n_ctx);
    if !args.ring.is_ring() {
        let mut session = args.ring.local_session(&engine, n_ctx, n_batch, 0)?;
        return run_job(&mut session, &mut job, n_vocab, bos, n_batch);
    }
    let transport = args.ring.transport()?;
    let mut head = args.ring.connect(&engine, &transport, n_ctx, n_batch, 0)?;
    let result = run_job(&mut head, &mut job, n_vocab, bos, n_batch);
    head.shutdown(false);
    result
}

fn run_job<F: RowLogits>(
    forward: &mut F,
    job: &mut Job,
    n_vocab: usize,
    bos: Option<u32>,
    n_batch: usize,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut timing = Timing::default();
    match job {
        Job::Perplexity {
            tokens,
            chunking,
            base,
        } => {
            eprintln!(
                "perplexity: calculating perplexity over {} chunks, n_ctx={}, batch_size={n_batch}, n_seq=1",
                chunking.n_chunk, chunking.n_ctx
            );
            let stats = perplexity(
                forward,
                n_vocab,
                bos,
                tokens,
                *chunking,
                base.as_mut(),
                |report: ChunkReport<'_, NllStats>| {
                    timing.chunk(&report, "perplexity");
                    // The running estimate, as llama-perplexity prints it.
                    let _ = write!(out, "[{}]{:.4},", report.chunk, report.stats.ppl());
                    let _ = out.flush();
                },
            )?;
            writeln!(out)?;
            if let Some(base) = base.take() {
                base.finish().context("writing the reference logits")?;
            }
            match stats.ppl_error() {
                Some(error) => writeln!(
                    out,
                    "Final estimate: PPL = {:.4} +/- {:.5}",
                    stats.ppl(),
                    error
                )?,
                None => writeln!(out, "Final estimate: PPL = {:.4}", stats.ppl())?,
            }
            timing.summary(chunking.n_ctx);
        }
        Job::KlDivergence { reference } => {
            let header = reference.header();
            eprintln!(
                "kl_divergence: computing over {} chunks, n_ctx={}, batch_size={n_batch}, n_seq=1",
                header.n_chunk, header.n_ctx
            );
            let n_ctx = header.n_ctx;
            writeln!(
                out,
                "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
            )?;
            let stats = kl_divergence(
                forward,
                n_vocab,
                bos,
                &mut **reference,
                |report: ChunkReport<'_, KldStats>| {
                    timing.chunk(&report, "kl_divergence");
                    let s = report.stats;
                    let (ppl, ratio, kld) = (s.ppl(), s.log_ppl_ratio(), s.kld());
                    let (rms, top) = (s.p_diff_rms(), s.same_top());
                    let _ = writeln!(
                        out,
                        "{:4}    {:9.4} ± {:9.4}    {:10.5} ± {:10.5}    {:10.5} ± {:10.5}    {:6.3} ± {:6.3} %    {:6.3} ± {:6.3} %",
                        report.chunk,
                        ppl.value,
                        ppl.error,
                        ratio.value,
                        ratio.error,
                        kld.value,
                        kld.error,
                        100.0 * rms.value,
                        100.0 * rms.error,
                        100.0 * top.value,
                        100.0 * top.error
                    );
                },
            )?;
            writeln!(out)?;
            print_kld_summary(&mut out, &stats)?;
            timing.summary(n_ctx);
        }
    }
    Ok(())
}

/// Seconds per chunk: the first one's with an estimate of the rest (as llama-perplexity
/// prints it), and the mean at the end.
#[derive(Default)]
struct Timing {
    total: Duration,
    chunks: usize,
}

impl Timing {
    fn chunk<S>(&mut self, report: &ChunkReport<'_, S>, name: &str) {
        self.total += report.elapsed;
        self.chunks += 1;
        if report.chunk == 1 {
            let secs = report.elapsed.as_secs_f64();
            eprintln!(
                "{name}: {secs:.2} seconds per pass - ETA {:.2} minutes",
                secs * report.n_chunk as f64 / 60.0
            );
        }
    }

    fn summary(&self, n_ctx: usize) {
        let per_chunk = self.total.as_secs_f64() / self.chunks.max(1) as f64;
        eprintln!(
            "timing: {} chunks of {n_ctx} tokens, {:.3} s per chunk, {:.1} tokens/s",
            self.chunks,
            per_chunk,
            n_ctx as f64 / per_chunk.max(1e-9)
        );
    }
}

fn print_kld_summary(out: &mut impl Write, s: &KldStats) -> std::io::Result<()> {
    let pm = |e: Estimate| format!("{:10.6} ± {:10.6}", e.value, e.error);
    let pct = |e: Estimate| format!("{:6.3} ± {:5.3} %", 100.0 * e.value, 100.0 * e.error);
    writeln!(out, "====== Perplexity statistics ======")?;
    writeln!(out, "Mean PPL(Q)                   : {}", pm(s.ppl()))?;
    writeln!(out, "Mean PPL(base)                : {}", pm(s.ppl_base()))?;
    writeln!(
        out,
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:6.2}%",
        100.0 * s.log_ppl_correlation()
    )?;
    writeln!(
        out,
        "Mean ln(PPL(Q)/PPL(base))     : {}",
        pm(s.log_ppl_ratio())
    )?;
    writeln!(out, "Mean PPL(Q)/PPL(base)         : {}", pm(s.ppl_ratio()))?;
    writeln!(out)?;
    writeln!(out, "====== KL divergence statistics ======")?;
    writeln!(out, "Mean    KLD: {}", pm(s.kld()))?;
    let fractions = [
        1.0, 0.999, 0.99, 0.95, 0.9, 0.5, 0.1, 0.05, 0.01, 0.001, 0.0,
    ];
    let names = [
        "Maximum", "99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ", "Median ", "10.0%  ", " 5.0%  ",
        " 1.0%  ", " 0.1%  ", "Minimum",
    ];
    for (name, v) in names.iter().zip(s.kld_percentiles(&fractions)) {
        writeln!(out, "{name} KLD: {v:10.6}")?;
    }
    writeln!(out)?;
    writeln!(out, "====== Token probability statistics ======")?;
    writeln!(out, "Mean    Δp: {}", pct(s.p_diff()))?;
    writeln!(
        out,
        "Maximum |Δp|: {:6.3}%",
        100.0 * f64::from(s.max_p_diff())
    )?;
    let p = s.p_diff_percentiles(&[0.5]);
    writeln!(out, "Median  Δp: {:6.3}%", 100.0 * p[0])?;
    writeln!(out, "RMS Δp    : {}", pct(s.p_diff_rms()))?;
    writeln!(out, "Same top p: {}", pct(s.same_top()))
}
