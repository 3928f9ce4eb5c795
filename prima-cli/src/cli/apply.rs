//! `prima apply MANIFEST`: validate the manifest, start the local nodes it owns, connect
//! the remote ones, plan the layer windows, print the plan, launch the ring, and then run
//! one prompt (`--prompt`) or serve until Ctrl-C — stopping the nodes it started.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use prima_abi::transport::TransportConfig;
use prima_cluster::controller::{
    self, local_node_specs, name_devices, ring_options, LaunchSettings, LocalNodes, Plan,
    PlanInputs, MAX_FRAME_BYTES,
};
use prima_cluster::manifest::{fill_addresses, LoadedManifest};
use prima_cluster::prp::failover::ResilientRing;
use prima_cluster::prp::micro_batch::MicroBatches;
use prima_cluster::prp::{RingError, RingOptions};
use prima_core::chat::{render_chat, ChatMessage};
use prima_core::generate::GenerateOptions;
use prima_core::model::Model;
use prima_core::plugin::load_transport;
use prima_core::sampler::{Sampler, SamplerConfig};
use prima_server::metrics as server_metrics;
use prima_server::{
    serve_blocking, serve_blocking_batch, serve_blocking_speculative, shutdown_when_set, Drafting,
    SchedulerOptions,
};

use super::engine::{Engine, EngineArgs};
use super::keygen::manifest_security;
use super::run::{
    print_device_table, print_draft_summary, print_summary, stream_maybe_draft, DraftModel,
};
use super::spinner;

#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// The cluster manifest (default: the embedded manifests/home.toml).
    manifest: Option<PathBuf>,
    /// Run this GGUF file on every local device, instead of the manifest's `[model]`
    /// (e.g. from an unpacked release, whose home.toml expects `models/` beside it).
    #[arg(short = 'm', long, value_name = "PATH")]
    model: Option<PathBuf>,
    /// Stop after printing the plan.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run, print the plan as JSON.
    #[arg(long, requires = "dry_run")]
    json: bool,
    /// Run one generation from this prompt, print it with TTFT/TPOT, and exit.
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Wrap --prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most for --prompt.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    n_predict: usize,
    /// Sampling temperature for --prompt; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temp: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print per-device timing after --prompt.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Leave the local nodes running on exit; the next apply of this manifest reuses
    /// those whose configuration is unchanged.
    #[arg(long)]
    keep_nodes: bool,
    /// After --prompt, write every device's per-pass statistics to this file as JSON.
    #[arg(long, requires = "prompt")]
    stats_json: Option<PathBuf>,
    /// A draft model for --prompt (speculative decoding on the head), instead of the
    /// manifest's `model.draft`.
    #[arg(long, value_name = "MODEL")]
    draft: Option<PathBuf>,
    /// Tokens the draft proposes per round at most (default: `model.draft_max`, else 8).
    #[arg(long)]
    draft_max: Option<usize>,
    /// Requests served at once, each with its own KV cache of policy.ctx positions
    /// (default: the manifest's [server] parallel, else 1).
    #[arg(long, value_parser = super::serve::parse_parallel)]
    parallel: Option<usize>,
    /// Micro-batches the head keeps in the ring at once when several requests are served:
    /// N ≥ 1, or `tuned` to measure (default: the manifest's policy.micro_batches, else
    /// PRIMA_MICRO_BATCHES, else 1).
    #[arg(long, value_name = "N|tuned", value_parser = MicroBatches::parse)]
    micro_batches: Option<MicroBatches>,
}

pub fn run(args: ApplyArgs) -> anyhow::Result<()> {
    let mut manifest = match &args.manifest {
        Some(path) => LoadedManifest::load(path)?,
        None => LoadedManifest::embedded_default()?,
    };
    // [discovery]: devices given no address are looked for on the LAN; given ones win.
    let (security, key_file) = manifest_security(&manifest)?;
    for (name, addr) in fill_addresses(&mut manifest.manifest, &security)? {
        eprintln!("found     {name} at {addr} (discovery)");
    }
    if let Some(model) = &args.model {
        manifest.override_model(model)?;
    }
    // The flags stand for their manifest fields from here on, so the plan (and every
    // re-plan after a loss) counts the slots' KV caches and the draft on the head.
    if let Some(draft) = &args.draft {
        manifest.manifest.model.draft = Some(std::path::absolute(draft)?);
    }
    manifest.manifest.server.parallel = match args.prompt {
        // One prompt needs one slot; a server keeps `parallel` on every device.
        Some(_) => 1,
        None => args.parallel.unwrap_or(manifest.manifest.server.parallel),
    };
    let m = &manifest.manifest;
    let head = manifest.head_index()?;
    let head_name = m.devices[head].name.clone();
    let head_model = manifest.model_path(&head_name);
    for d in m.devices.iter().filter(|d| d.local || d.head) {
        let path = manifest.model_path(&d.name);
        if !path.exists() && args.model.is_some() {
            bail!("--model: model file {} not found", path.display());
        }
        if !path.exists() {
            bail!(
                "device '{}': model file {} not found (run `cargo xtask fetch-models`, fix [model] path in {}, or give --model PATH)",
                d.name,
                path.display(),
                manifest.path.display()
            );
        }
    }

    // Ctrl-C or SIGTERM ends the prompt or the server cleanly, so the local nodes are
    // dropped (stopped, or recorded with --keep-nodes) on the way out.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }

    // The controller: local nodes, profiles and plan, then the ring (`prima_cluster::controller`).
    let transport_name = controller::transport_for(&manifest, head);
    let exe = std::env::current_exe().context("cannot find the prima binary")?;
    let specs = local_node_specs(
        &manifest,
        head,
        &exe,
        transport_name.as_deref(),
        key_file.as_deref(),
        &security,
    );
    let bar = spinner(format!("starting {} local nodes", specs.len()));
    let local_nodes = LocalNodes::start(&manifest.path, &specs, args.keep_nodes);
    bar.finish_and_clear();
    let local_nodes = local_nodes?;
    for n in local_nodes.running() {
        let how = if local_nodes.reused().contains(&n.name) {
            "reused "
        } else {
            "started"
        };
        eprintln!("{how}   {} on {} (pid {})", n.name, n.addr, n.pid);
    }
    let addr_of = |name: &str| local_nodes.addr_of(name);

    let head_device = &m.devices[head];
    let engine_args = EngineArgs {
        model: head_model.clone(),
        threads: head_device.threads,
        backend: head_device.backend.clone(),
        gpu_layers: None,
        gpu_backend: head_device.gpu_backend.clone(),
    };
    // With profiles from a file, a dry run needs neither a backend nor a transport, and
    // the model is read for its shapes alone; otherwise the engine loads it, once.
    let fixtures_only = m.policy.profiles.is_some() && args.dry_run;
    let (engine, shapes_only) = if fixtures_only {
        (None, Some(Model::load(&head_model)?))
    } else {
        (Some(Engine::open_planned(&engine_args)?), None)
    };
    let model: &Model = match (&engine, &shapes_only) {
        (Some(e), _) => &e.model,
        (None, Some(m)) => m,
        (None, None) => unreachable!("one of the two is loaded above"),
    };
    let transport = match &engine {
        None => None,
        Some(_) => Some(load_transport(
            transport_name.as_deref(),
            TransportConfig {
                max_frame_bytes: MAX_FRAME_BYTES,
            },
        )?),
    };
    let policy = &m.policy;
    // Speculative decoding: the draft, opened once, is checked before anything is planned
    // (the plan leaves room for it on the head).
    let draft = match (manifest.draft_path(), &engine) {
        (Some(path), Some(engine)) => {
            let defaults = prima_core::speculative::DraftOptions::default();
            let options = prima_core::speculative::DraftOptions {
                max: args.draft_max.or(m.model.draft_max).unwrap_or(defaults.max),
                ..defaults
            };
            Some(DraftModel::open(&path, options, engine)?)
        }
        _ => None,
    };
    let draft_shapes = match (manifest.draft_path(), &draft) {
        (Some(path), None) => {
            Some(Model::load(&path).with_context(|| format!("model.draft {}", path.display()))?)
        }
        _ => None,
    };
    let draft_model = draft.as_ref().map(|d| &d.model).or(draft_shapes.as_ref());
    let bar = spinner("planning".to_string());
    let plan = controller::plan(&PlanInputs {
        manifest: &manifest,
        model,
        head,
        backend: engine.as_ref().map(|e| &e.backend),
        gpu: engine.as_ref().and_then(|e| e.gpu.as_ref()),
        transport: transport.as_ref().map(|t| &t.transport),
        addr_of: &addr_of,
        known: &[],
        security: &security,
        draft: draft_model,
    });
    bar.finish_and_clear();
    let plan = plan?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan.to_json())?);
    } else {
        eprint!("{}", plan.table());
    }
    let (Some(engine), Some(transport)) = (engine, transport) else {
        return Ok(());
    };
    if args.dry_run {
        return Ok(());
    }

    let n_ctx = policy.ctx.min(engine.model.hparams().n_ctx_train.max(1));
    let parallel = m.server.parallel;
    if let Some(d) = &draft {
        anyhow::ensure!(
            d.options.max >= 1 && d.options.max < policy.batch,
            "draft_max {} must be at least 1 and leave room for the last token in a batch of \
             policy.batch = {} tokens",
            d.options.max,
            policy.batch
        );
    }
    let windows: Vec<usize> = plan.ring().map(|d| d.w).collect();
    let options = ring_options(
        &manifest,
        head,
        &plan,
        LaunchSettings {
            n_ctx,
            micro_batches: match args.micro_batches.or(policy.micro_batches) {
                Some(m) => m.count(),
                None => micro_batches_from_env()?,
            },
            // The draft's weights and KV caches live on the head beside its windows.
            head_reserved: draft
                .as_ref()
                .map_or(0, |d| d.memory_bytes(n_ctx, policy.batch, parallel)),
            security,
        },
    );
    let head_gpu_layers = plan.ring().next().map_or(0, |d| d.n);
    if engine.gpu.is_none() && head_gpu_layers > 0 {
        eprintln!(
            "the plan puts {head_gpu_layers} layers per window on the head's GPU, but it has no usable GPU backend plugin: they run on its backend"
        );
    }
    // A lost device is planned out (and back in when it answers again) without losing
    // the request (`controller::replanner`, `prp/failover.rs`).
    let on_replan = |lost: &[String], planned: &Plan| {
        if lost.is_empty() {
            eprintln!("failover: new plan over every device");
        } else {
            eprintln!("failover: new plan without {}", lost.join(", "));
        }
        eprint!("{}", planned.table());
    };
    let bar = spinner(format!("launching the ring ({} devices)", windows.len()));
    let head_ring = controller::launch(
        &engine.model,
        &engine.backend.backend,
        engine.gpu.as_ref().map(|g| &g.backend),
        &transport.transport,
        &plan,
        &options,
        controller::replanner(
            &manifest,
            &engine.model,
            &addr_of,
            plan.profiles.clone(),
            &options.security,
            draft.as_ref().map(|d| &d.model),
            &on_replan,
        ),
    );
    bar.finish_and_clear();
    let head_ring = head_ring?;

    let Some(prompt_text) = &args.prompt else {
        return serve_until_interrupted(
            &manifest,
            &plan,
            &engine,
            head_ring,
            draft.as_ref(),
            n_ctx,
            policy.batch,
            parallel,
            interrupted,
        );
    };
    let tok = &engine.tokenizer;
    let text = if args.chat {
        let template = tok
            .chat_template()
            .context("--chat needs tokenizer.chat_template, which the model lacks")?;
        render_chat(
            template,
            &[ChatMessage::new("user", prompt_text.clone())],
            true,
            tok.bos_text(),
            tok.eos_text(),
        )?
    } else {
        prompt_text.clone()
    };
    let add_bos = tok.add_bos_default()
        && !(args.chat && text.starts_with(tok.bos_text()) && !tok.bos_text().is_empty());
    let prompt = tok.encode(&text, add_bos, true);
    anyhow::ensure!(!prompt.is_empty(), "the prompt is empty after tokenization");
    anyhow::ensure!(
        prompt.len() < n_ctx,
        "the prompt has {} tokens but the context holds {n_ctx} (raise policy.ctx)",
        prompt.len()
    );
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: args.temp,
        seed: args.seed,
        ..SamplerConfig::default()
    });
    let gen = GenerateOptions {
        max_tokens: args.n_predict,
        ignore_eos: false,
    };
    let backend = engine.describe_backends();
    let mut draft_session = match &draft {
        Some(d) => Some((d.session(&engine, n_ctx, policy.batch, 1)?, d.options)),
        None => None,
    };
    let draft_session = draft_session.as_mut().map(|(s, o)| (s, *o));
    let (stats, draft_stats) = match head_ring {
        Some(mut ring) => {
            let (stats, draft_stats) = stream_maybe_draft(
                &mut ring,
                draft_session,
                tok,
                &mut sampler,
                &prompt,
                gen,
                &interrupted,
            )
            .map_err(|e| match e.downcast::<RingError>() {
                Ok(r) => name_devices(r, &plan),
                Err(e) => e,
            })?;
            print_summary(
                &stats,
                args.seed,
                &format!(
                    "{backend} | ring of {} devices, k = {}",
                    windows.len(),
                    ring.rounds()
                ),
            );
            if args.verbose || args.stats_json.is_some() {
                let stats = ring.collect_stats()?;
                if args.verbose {
                    print_device_table(&stats);
                }
                if let Some(path) = &args.stats_json {
                    std::fs::write(path, serde_json::to_vec_pretty(&stats)?)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                }
            }
            // Kept nodes go back to waiting for a head; the others are stopped anyway.
            ring.shutdown(false);
            (stats, draft_stats)
        }
        None => {
            let mut session = engine.session(n_ctx, policy.batch, 1, head_gpu_layers)?;
            let (stats, draft_stats) = stream_maybe_draft(
                &mut session,
                draft_session,
                tok,
                &mut sampler,
                &prompt,
                gen,
                &interrupted,
            )?;
            print_summary(&stats, args.seed, &format!("{backend} | the head alone"));
            (stats, draft_stats)
        }
    };
    if let Some(d) = &draft_stats {
        print_draft_summary(d, &stats);
    }
    Ok(())
}

/// Serves the OpenAI-compatible API on the manifest's `[server] listen` address until
/// Ctrl-C or SIGTERM; then the ring's nodes are released (and the local ones stopped).
#[allow(clippy::too_many_arguments)]
fn serve_until_interrupted(
    manifest: &LoadedManifest,
    plan: &Plan,
    engine: &Engine,
    head_ring: Option<ResilientRing<'_>>,
    draft: Option<&DraftModel>,
    n_ctx: usize,
    n_batch: usize,
    parallel: usize,
    interrupted: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let addr = &manifest.manifest.server.listen;
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("[server] listen = \"{addr}\": cannot listen there"))?;
    let bound = listener.local_addr()?;
    let name = manifest
        .model_path(&plan.devices[0].name)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "prima".into());
    eprintln!(
        "serve: listening on http://{bound} (model {name}, context {n_ctx} tokens, {} devices) — Ctrl-C stops",
        plan.ring().count()
    );
    let shutdown = Some(shutdown_when_set(interrupted));
    let tok = &engine.tokenizer;
    // With a draft model, every slot drafts on the head (a draft slot per slot) and one
    // batch verifies all their drafts.
    let mut draft_session = match draft {
        Some(d) => Some((d.session(engine, n_ctx, n_batch, parallel)?, d.options)),
        None => None,
    };
    let options = SchedulerOptions::default();
    match head_ring {
        Some(mut ring) => {
            let after_job = |h: &mut ResilientRing<'_>| {
                let names: Vec<String> = h.devices().iter().map(|d| d.name.clone()).collect();
                if let Ok(stats) = h.collect_stats() {
                    server_metrics::record_ring_stats(&stats, &names);
                }
                // Between requests: a lost device that answers again is planned back in.
                if let Err(e) = h.readmit() {
                    eprintln!("failover: {e}");
                }
                server_metrics::record_failover(&h.take_events(), h.devices().len());
            };
            if let Some((draft, draft_options)) = draft_session.as_mut() {
                let model = Drafting {
                    target: &mut ring,
                    draft,
                    options: *draft_options,
                };
                serve_blocking_speculative(
                    model, tok, &name, listener, shutdown, options, after_job,
                )?;
            } else if parallel == 1 {
                serve_blocking(&mut ring, tok, &name, listener, shutdown, after_job)?;
            } else {
                serve_blocking_batch(
                    &mut ring, tok, &name, listener, shutdown, options, after_job,
                )?;
            }
            ring.shutdown(false);
        }
        None => {
            let head_gpu_layers = plan.ring().next().map_or(0, |d| d.n);
            let mut session = engine.session(n_ctx, n_batch, parallel, head_gpu_layers)?;
            if let Some((draft, draft_options)) = draft_session.as_mut() {
                let model = Drafting {
                    target: &mut session,
                    draft,
                    options: *draft_options,
                };
                serve_blocking_speculative(model, tok, &name, listener, shutdown, options, |_| {})?;
            } else if parallel > 1 {
                serve_blocking_batch(
                    &mut session,
                    tok,
                    &name,
                    listener,
                    shutdown,
                    options,
                    |_| {},
                )?;
            } else {
                serve_blocking(&mut session, tok, &name, listener, shutdown, |_| {})?;
            }
        }
    }
    eprintln!("serve: stopped");
    Ok(())
}

/// `PRIMA_MICRO_BATCHES=N|tuned`, the fallback of `--micro-batches` and
/// `policy.micro_batches`; unset: the default, one batch at a time.
fn micro_batches_from_env() -> anyhow::Result<Option<usize>> {
    match std::env::var("PRIMA_MICRO_BATCHES") {
        Err(_) => Ok(RingOptions::default().micro_batches),
        Ok(v) => match MicroBatches::parse(&v) {
            Ok(m) => Ok(m.count()),
            Err(e) => bail!("PRIMA_MICRO_BATCHES {e}"),
        },
    }
}
