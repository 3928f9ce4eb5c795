//! `prima bench`: prompt-processing and generation throughput, measured the way
//! llama-bench measures them so the two can be compared side by side.
//!
//! Prompt processing (pp): one batch of `-p` token ids evaluated on an empty cache.
//! Generation (tg): `-n` tokens evaluated one at a time from an empty cache. With
//! `--parallel N`, N sequences (slots, each with its own cache) generate together, one
//! token each per batched step, as the server's continuous batching steps them, and the
//! rate is all of theirs together (llama-batched-bench's TG). Each is repeated `-r` times
//! after one untimed warm-up run; the mean and sample standard deviation of tokens per
//! second are reported.

use std::io::Write;
use std::time::Instant;

use prima_abi::backend::TransferCounts;
use prima_cluster::prp::budget::MemBudget;
use prima_core::batch::{BatchForward, SeqTokens};
use prima_core::generate::Forward;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::engine::{Engine, EngineArgs, Streaming};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Prompt tokens per prompt-processing run (0 skips the test).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens per generation run (0 skips the test).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Sequences generating together in the generation test, each in a slot of its own,
    /// one batched step for all (llama.cpp's -np); tokens per second are theirs together.
    #[arg(long, default_value_t = 1, value_parser = super::parse_parallel)]
    parallel: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Bytes of weights to keep in memory (e.g. 1G), `auto` or `none`; layers beyond it
    /// are streamed from disk each token (see `prima run --mem-budget`).
    #[arg(long, default_value = "auto", value_parser = MemBudget::parse)]
    mem_budget: MemBudget,
    /// Also measure the memory read bandwidth and the bandwidth efficiency of generation.
    #[arg(long)]
    mem_bw: bool,
}

#[derive(Serialize)]
struct Report {
    model: String,
    backend: String,
    threads: Option<u32>,
    n_prompt: usize,
    n_gen: usize,
    parallel: usize,
    repetitions: usize,
    prompt_tokens_per_s: f64,
    prompt_tokens_per_s_sd: f64,
    gen_tokens_per_s: f64,
    gen_tokens_per_s_sd: f64,
    /// Weight bytes one generated token reads (every tensor but the embedding table,
    /// of which one row is read, unless it is also the output head).
    weight_bytes_per_token: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    mem_read_bytes_per_s: Option<f64>,
    /// weight_bytes_per_token × gen tok/s ÷ memory read bandwidth.
    #[serde(skip_serializing_if = "Option::is_none")]
    bandwidth_efficiency: Option<f64>,
    /// What crossed between host and device per generated token (backend ABI v5 counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    transfers_per_token: Option<TransfersPerToken>,
}

/// Host↔device traffic per generated token, the means over every generation pass.
#[derive(Serialize)]
struct TransfersPerToken {
    uploads: f64,
    downloads: f64,
    waits: f64,
    submissions: f64,
    bytes: f64,
}

/// Bytes of weights a single decode step streams from memory.
/// Weight bytes one generated token reads: every tensor, but of the embedding table only
/// its row (when the output head is separate) and of a mixture's experts only the k of n
/// a token selects.
fn weight_bytes_per_token(model: &prima_core::model::Model) -> u64 {
    let g = model.gguf();
    let total: u64 = g
        .tensors()
        .iter()
        .map(|t| match model.experts() {
            Some(e) if t.name.contains("_exps.") && e.n_expert > 0 => {
                t.n_bytes * e.n_expert_used as u64 / e.n_expert as u64
            }
            _ => t.n_bytes,
        })
        .sum();
    match (g.tensor("token_embd.weight"), g.tensor("output.weight")) {
        // Separate output head: the embedding table is only looked up, one row per token.
        (Some(embd), Some(_)) => total - embd.n_bytes + embd.n_bytes / embd.rows().max(1),
        _ => total,
    }
}

fn mean_sd(samples: &[f64]) -> (f64, f64) {
    if samples.is_empty() {
        return (0.0, 0.0);
    }
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = if samples.len() > 1 {
        samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.reps > 0, "--repetitions must be at least 1");
    let engine = Engine::open(&args.engine)?;
    let hp = engine.model.hparams();
    let n_ctx = args.n_prompt.max(args.n_gen).max(1);
    anyhow::ensure!(
        n_ctx <= hp.n_ctx_train,
        "{n_ctx} tokens exceed the model's context of {}",
        hp.n_ctx_train
    );
    let mut session = engine.local_slots(
        args.mem_budget,
        n_ctx,
        args.n_prompt.max(args.parallel),
        args.parallel,
        Streaming::default(),
    )?;
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let vocab = hp.n_vocab as u32;
    let prompt: Vec<u32> = (0..args.n_prompt)
        .map(|_| rng.gen_range(0..vocab))
        .collect();

    // The table's rows are printed as each finishes, as llama-bench does.
    let row = |test: String, samples: &[f64]| {
        if !args.json {
            let (mean, sd) = mean_sd(samples);
            println!("| {test:<6} | {mean:>7.2} ± {sd:>5.2} |");
            let _ = std::io::stdout().flush();
        }
    };
    if !args.json {
        println!(
            "model: {} | {}",
            engine.path.display(),
            engine.describe_backends()
        );
        println!("| test   |            t/s |");
        println!("| ------ | -------------: |");
        let _ = std::io::stdout().flush();
    }
    let mut pp = Vec::with_capacity(args.reps);
    if args.n_prompt > 0 {
        for rep in 0..=args.reps {
            Forward::truncate(&mut session, 0)?;
            let start = Instant::now();
            session.eval(&prompt)?;
            let secs = start.elapsed().as_secs_f64();
            if rep > 0 {
                pp.push(args.n_prompt as f64 / secs);
            }
        }
    }
    if args.n_prompt > 0 {
        row(format!("pp{}", args.n_prompt), &pp);
    }
    let mut tg = Vec::with_capacity(args.reps);
    let transfers_before = engine_transfers(&engine);
    if args.n_gen > 0 && args.parallel == 1 {
        for rep in 0..=args.reps {
            Forward::truncate(&mut session, 0)?;
            let mut token = rng.gen_range(0..vocab);
            let start = Instant::now();
            for _ in 0..args.n_gen {
                let logits = session.eval(&[token])?;
                // Feed back a token derived from the logits so no step can be skipped.
                token = (logits[0].to_bits() % vocab.max(1)).min(vocab - 1);
            }
            let secs = start.elapsed().as_secs_f64();
            if rep > 0 {
                tg.push(args.n_gen as f64 / secs);
            }
        }
    } else if args.n_gen > 0 {
        let n_vocab = hp.n_vocab;
        for rep in 0..=args.reps {
            for slot in 0..args.parallel {
                BatchForward::truncate(&mut session, slot, 0)?;
            }
            let mut tokens: Vec<u32> = (0..args.parallel)
                .map(|_| rng.gen_range(0..vocab))
                .collect();
            let start = Instant::now();
            for _ in 0..args.n_gen {
                let next = {
                    let step: Vec<SeqTokens<'_>> = tokens
                        .iter()
                        .enumerate()
                        .map(|(slot, t)| SeqTokens {
                            slot,
                            tokens: std::slice::from_ref(t),
                        })
                        .collect();
                    let logits = session.eval_batch(&step)?;
                    // Each slot goes on with a token derived from its own logits.
                    (0..args.parallel)
                        .map(|i| (logits[i * n_vocab].to_bits() % vocab.max(1)).min(vocab - 1))
                        .collect::<Vec<u32>>()
                };
                tokens = next;
            }
            let secs = start.elapsed().as_secs_f64();
            if rep > 0 {
                tg.push((args.n_gen * args.parallel) as f64 / secs);
            }
        }
    }

    // Every generated token of every repetition (and the warm-up) crossed this.
    let generated = (args.n_gen * args.parallel * (args.reps + 1)).max(1) as f64;
    let crossed = engine_transfers(&engine).since(transfers_before);
    let transfers = TransfersPerToken {
        uploads: crossed.uploads as f64 / generated,
        downloads: crossed.downloads as f64 / generated,
        waits: crossed.waits as f64 / generated,
        submissions: crossed.submissions as f64 / generated,
        bytes: (crossed.bytes_up + crossed.bytes_down) as f64 / generated,
    };
    if args.n_gen > 0 {
        match args.parallel {
            1 => row(format!("tg{}", args.n_gen), &tg),
            n => row(format!("tg{}x{n}", args.n_gen), &tg),
        }
    }
    let (pp_mean, pp_sd) = mean_sd(&pp);
    let (tg_mean, tg_sd) = mean_sd(&tg);
    let bytes_per_token = weight_bytes_per_token(&engine.model);
    let mem_bw = args.mem_bw.then(|| {
        let threads = args.engine.threads.map(|t| t as usize).unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        prima_cluster::profile::memory_read_bandwidth(1 << 30, threads, 5).bytes_per_s
    });
    let report = Report {
        model: engine.path.display().to_string(),
        backend: engine.describe_backends(),
        threads: args.engine.threads,
        n_prompt: args.n_prompt,
        n_gen: args.n_gen,
        parallel: args.parallel,
        repetitions: args.reps,
        prompt_tokens_per_s: pp_mean,
        prompt_tokens_per_s_sd: pp_sd,
        gen_tokens_per_s: tg_mean,
        gen_tokens_per_s_sd: tg_sd,
        weight_bytes_per_token: bytes_per_token,
        mem_read_bytes_per_s: mem_bw,
        bandwidth_efficiency: mem_bw.map(|bw| bytes_per_token as f64 * tg_mean / bw),
        transfers_per_token: (args.n_gen > 0).then_some(transfers),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        if let Some(t) = &report.transfers_per_token {
            println!(
                "host↔device per generated token: {:.1} uploads, {:.1} downloads, {:.1} waits, \
                 {:.1} submissions, {:.0} bytes",
                t.uploads, t.downloads, t.waits, t.submissions, t.bytes
            );
        }
        if let (Some(bw), Some(eff)) = (report.mem_read_bytes_per_s, report.bandwidth_efficiency) {
            println!(
                "memory read {:.1} GB/s; generation streams {:.1} MB/token = {:.0}% of it",
                bw / 1e9,
                bytes_per_token as f64 / 1e6,
                eff * 100.0
            );
        }
    }
    Ok(())
}

/// The host↔device traffic of the engine's backends so far (the GPU's too, beside the CPU).
fn engine_transfers(engine: &Engine) -> TransferCounts {
    let own = engine.backend.transfers();
    match &engine.gpu {
        Some(gpu) => own.plus(gpu.transfers()),
        None => own,
    }
}
