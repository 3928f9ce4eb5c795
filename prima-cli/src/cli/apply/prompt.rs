//! `prima apply --prompt`: one generation on the launched ring (or the head alone),
//! streamed to stdout, with TTFT/TPOT (and per-device timing) on stderr.

use std::path::PathBuf;

use anyhow::Context;
use prima_cluster::controller::name_devices;
use prima_cluster::prp::failover::ResilientRing;
use prima_cluster::prp::RingError;
use prima_core::generate::GenerateOptions;
use prima_core::sampler::Sampler;

use super::cluster::Cluster;
use crate::cli::interactive::{chat_prompt, encode_prompt};
use crate::cli::run::{print_device_table, print_draft_summary, print_summary, stream_maybe_draft};
use crate::cli::sampling::SamplingArgs;

/// The prompt and how to generate from it.
pub struct Prompt {
    pub text: String,
    /// Wrap the text as a user message in the model's chat template.
    pub chat: bool,
    pub sampling: SamplingArgs,
    /// Print per-device timing.
    pub verbose: bool,
    /// Write every device's per-pass statistics here as JSON.
    pub stats_json: Option<PathBuf>,
}

/// Generates from `prompt` on `ring` (`None`: the head alone).
pub fn run(
    cluster: &Cluster,
    ring: Option<ResilientRing<'_>>,
    prompt: &Prompt,
) -> anyhow::Result<()> {
    let engine = &cluster.engine;
    let policy = &cluster.manifest.manifest.policy;
    let n_ctx = cluster.options.n_ctx;
    let tok = &engine.tokenizer;
    let text = if prompt.chat {
        chat_prompt(tok, &engine.path, None, &prompt.text)?
    } else {
        prompt.text.clone()
    };
    let tokens = encode_prompt(tok, &text, prompt.chat);
    anyhow::ensure!(!tokens.is_empty(), "the prompt is empty after tokenization");
    anyhow::ensure!(
        tokens.len() < n_ctx,
        "the prompt has {} tokens but the context holds {n_ctx} (raise policy.ctx)",
        tokens.len()
    );
    let seed = prompt.sampling.seed();
    let mut sampler = Sampler::new(prompt.sampling.config(seed));
    let gen = GenerateOptions {
        max_tokens: prompt.sampling.max_tokens(),
        ignore_eos: false,
    };
    let backend = engine.describe_backends();
    let mut draft_session = match &cluster.draft {
        Some(d) => Some((d.session(engine, n_ctx, policy.batch, 1)?, d.options)),
        None => None,
    };
    let draft_session = draft_session.as_mut().map(|(s, o)| (s, *o));
    let interrupted = &cluster.interrupted;
    let (stats, draft_stats) = match ring {
        Some(mut ring) => {
            let (stats, draft_stats) = stream_maybe_draft(
                &mut ring,
                draft_session,
                tok,
                &mut sampler,
                &tokens,
                gen,
                interrupted,
            )
            .map_err(|e| match e.downcast::<RingError>() {
                Ok(r) => name_devices(r, &cluster.plan).into(),
                Err(e) => e,
            })?;
            print_summary(
                &stats,
                seed,
                &format!(
                    "{backend} | ring of {} devices, k = {}",
                    cluster.plan.ring().count(),
                    ring.rounds()
                ),
            );
            predicted_beside_measured(cluster, stats.tpot_ms(), stats.generated_tokens);
            if prompt.verbose || prompt.stats_json.is_some() {
                let stats = ring.collect_stats()?;
                if prompt.verbose {
                    let names: Vec<String> = cluster.plan.ring().map(|d| d.name.clone()).collect();
                    print_device_table(&stats, &names);
                }
                if let Some(path) = &prompt.stats_json {
                    std::fs::write(path, serde_json::to_vec_pretty(&stats)?)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                }
            }
            // Kept nodes go back to waiting for a head; the others are stopped anyway.
            ring.shutdown(false);
            (stats, draft_stats)
        }
        None => {
            let mut session = engine.session(n_ctx, policy.batch, 1, cluster.head_gpu_layers())?;
            let (stats, draft_stats) = stream_maybe_draft(
                &mut session,
                draft_session,
                tok,
                &mut sampler,
                &tokens,
                gen,
                interrupted,
            )?;
            print_summary(&stats, seed, &format!("{backend} | the head alone"));
            predicted_beside_measured(cluster, stats.tpot_ms(), stats.generated_tokens);
            (stats, draft_stats)
        }
    };
    if let Some(d) = &draft_stats {
        print_draft_summary(d, &stats);
    }
    Ok(())
}

/// The plan's predicted TPOT beside the one just measured, and the measured one recorded
/// for `prima status`.
fn predicted_beside_measured(cluster: &Cluster, measured_ms: f64, generated: usize) {
    if generated < 2 || measured_ms <= 0.0 {
        return;
    }
    if let Some(predicted) = cluster.plan.predicted_tpot_ms {
        eprintln!(
            "TPOT: predicted {predicted:.2} ms, measured {measured_ms:.2} ms (measured/predicted {:.2})",
            measured_ms / predicted
        );
    }
    if let Err(e) = prima_cluster::controller::record_measured(&cluster.id, measured_ms) {
        eprintln!("warning: cannot record the measured TPOT: {e}");
    }
}
