//! Serving the OpenAI-compatible API from a launched cluster (`prima apply` without
//! `--prompt`, `prima serve --manifest`) on the manifest's `[server] listen` address,
//! until Ctrl-C or SIGTERM; then the ring's nodes are released.

use anyhow::Context;
use prima_cluster::prp::failover::ResilientRing;
use prima_server::{board, metrics as server_metrics};
use prima_server::{
    serve_blocking, serve_blocking_batch, serve_blocking_speculative, shutdown_when_set, Drafting,
    SchedulerOptions,
};

use super::cluster::Cluster;

/// Serves on `ring` (`None`: the head alone) until interrupted.
pub fn run(cluster: &Cluster, ring: Option<ResilientRing<'_>>) -> anyhow::Result<()> {
    let manifest = &cluster.manifest;
    let plan = &cluster.plan;
    let engine = &cluster.engine;
    let n_ctx = cluster.options.n_ctx;
    let n_batch = cluster.options.n_batch;
    let parallel = cluster.parallel();
    let addr = &manifest.manifest.server.listen;
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("[server] listen = \"{addr}\": cannot listen there"))?;
    let bound = listener.local_addr()?;
    let name = manifest
        .model_path(&plan.devices[0].name)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "prima".into());
    // The ring as connected: a device absent at start is not in it yet.
    let devices = ring.as_ref().map_or(1, |r| r.devices().len());
    eprintln!(
        "serve: listening on http://{bound} (model {name}, context {n_ctx} tokens, {devices} devices) — Ctrl-C stops"
    );
    board::show_plan(&name, plan, &engine.describe_backends());
    let shutdown = Some(shutdown_when_set(cluster.interrupted.clone()));
    let tok = &engine.tokenizer;
    // With a draft model, every slot drafts on the head (a draft slot per slot) and one
    // batch verifies all their drafts.
    let mut draft_session = match &cluster.draft {
        Some(d) => Some((d.session(engine, n_ctx, n_batch, parallel)?, d.options)),
        None => None,
    };
    let options = SchedulerOptions::default();
    match ring {
        Some(mut ring) => {
            // Statistics, re-admission and failover events, into the metrics and the
            // web page's cluster board.
            server_metrics::watch_ring(&mut ring);
            let after_job = |h: &mut ResilientRing<'_>| server_metrics::watch_ring(h);
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
            let mut session =
                engine.session(n_ctx, n_batch, parallel, cluster.head_gpu_layers())?;
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
