//! Bringing up the cluster a manifest declares, through the controller
//! (`prima_cluster::controller`): the manifest with the command line's overrides, the
//! local nodes, the head's engine (the model loaded once), the draft, the plan, the
//! ring's options; then [`Cluster::launch`]. `prima apply` and `prima serve --manifest`
//! both start here.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use prima_abi::transport::TransportConfig;
use prima_cluster::controller::{
    self, layout_of, local_node_specs, ring_options, ClusterId, LaunchSettings, LocalNodes, Plan,
    PlanInputs, RingPolicy, MAX_FRAME_BYTES,
};
use prima_cluster::manifest::{fill_addresses, LoadedManifest};
use prima_cluster::prp::failover::ResilientRing;
use prima_cluster::prp::micro_batch::MicroBatches;
use prima_cluster::prp::RingOptions;
use prima_core::model::Model;
use prima_core::plugin::{load_transport, LoadedTransport};

use super::report;
use crate::cli::engine::{Engine, EngineArgs};
use crate::cli::keygen::manifest_security;
use crate::cli::run::DraftModel;
use crate::cli::spinner;

/// What the command line changes in the manifest, and how the cluster is brought up.
#[derive(Debug, Default)]
pub struct Setup {
    /// The manifest (`None`: the embedded manifests/home.toml).
    pub manifest: Option<PathBuf>,
    /// A GGUF file for every local device, instead of the manifest's `[model]`.
    pub model: Option<PathBuf>,
    /// A draft model instead of the manifest's `model.draft`, and its tokens per round.
    pub draft: Option<PathBuf>,
    pub draft_max: Option<usize>,
    /// Slots instead of the manifest's `[server] parallel`.
    pub parallel: Option<usize>,
    /// Micro-batches in flight instead of `policy.micro_batches`.
    pub micro_batches: Option<MicroBatches>,
    /// Leave the local nodes running on exit (the next apply reuses them).
    pub keep_nodes: bool,
    /// Stop after the plan (printed as JSON with `json`).
    pub dry_run: bool,
    pub json: bool,
    /// The plan table with the paper's symbols.
    pub verbose: bool,
}

/// Where a device's local node listens, by its name.
type AddrOf = Box<dyn Fn(&str) -> Option<String>>;

/// A planned cluster, ready to launch: everything the ring borrows lives here.
pub struct Cluster {
    pub manifest: LoadedManifest,
    /// The engine of the head: its model (loaded once), backends and tokenizer.
    pub engine: Engine,
    pub transport: LoadedTransport,
    pub draft: Option<DraftModel>,
    pub plan: Plan,
    /// Which cluster this is: its kept nodes and last applied plan are filed under it.
    pub id: ClusterId,
    pub options: RingOptions,
    /// Set by Ctrl-C or SIGTERM: the prompt or the server ends, and the nodes stop.
    pub interrupted: Arc<AtomicBool>,
    /// Where the local nodes listen, by device name (for re-plans after a loss).
    addr_of: AddrOf,
    /// Stopped (or, with `--keep-nodes`, recorded) when the cluster is dropped.
    _nodes: LocalNodes,
}

impl Cluster {
    /// The manifest's `[server] parallel` (the command line's, where it gave one).
    pub fn parallel(&self) -> usize {
        self.manifest.manifest.server.parallel
    }

    /// The head's GPU layers per window (n_m of the plan's first device).
    pub fn head_gpu_layers(&self) -> usize {
        self.plan.ring().next().map_or(0, |d| d.n)
    }

    /// Connects the ring (`None`: the plan is the head alone), wrapped so that a lost
    /// device is planned out and back in without losing a request.
    pub fn launch(&self) -> anyhow::Result<Option<ResilientRing<'_>>> {
        let engine = &self.engine;
        let bar = spinner(format!(
            "launching the ring ({} devices)",
            self.plan.ring().count()
        ));
        let ring = controller::launch(
            &engine.model,
            &engine.backend.backend,
            engine.gpu.as_ref().map(|g| &g.backend),
            &self.transport.transport,
            &self.plan,
            &self.options,
            controller::replanner(
                &self.manifest,
                &engine.model,
                &*self.addr_of,
                self.plan.profiles.clone(),
                &self.transport.transport,
                &self.options.security,
                self.draft.as_ref().map(|d| &d.model),
                &report::replanned,
            ),
        );
        bar.finish_and_clear();
        match (ring, &self.manifest.manifest.model.hf) {
            (Err(e), Some(hf)) if e.to_string().contains("model mismatch") => {
                Err(anyhow::Error::new(e).context(format!(
                    "a device lacks the model {hf}: start its node with `prima node -hf {hf} …`"
                )))
            }
            (ring, _) => {
                let ring = ring?;
                // What runs now: the next `apply --dry-run` shows its changes against it.
                if let Err(e) =
                    controller::record_applied(&self.id, &self.manifest.path, &self.plan)
                {
                    eprintln!("warning: cannot record the applied plan: {e}");
                }
                Ok(ring)
            }
        }
    }
}

/// Loads the manifest, starts its local nodes, opens the head's engine, plans and prints
/// the plan; `None` after a dry run.
pub fn bring_up(setup: &Setup) -> anyhow::Result<Option<Cluster>> {
    let mut manifest = match &setup.manifest {
        Some(path) => LoadedManifest::load(path)?,
        None => LoadedManifest::embedded_default()?,
    };
    // [discovery]: devices given no address are looked for on the LAN; given ones win.
    let (security, key_file) = manifest_security(&manifest)?;
    for (name, addr) in fill_addresses(&mut manifest.manifest, &security)? {
        report::found(&name, &addr);
    }
    if let Some(model) = &setup.model {
        manifest.override_model(model)?;
    } else if let Some(hf) = manifest.manifest.model.hf.clone() {
        let name = crate::hub::name::ModelRef::parse(&hf)
            .map_err(|e| anyhow::anyhow!("{}: model.hf: {e}", manifest.path.display()))?;
        manifest.manifest.model.path = crate::hub::resolve(&name)?;
        report::hub_model(&manifest, &name);
    }
    // The flags stand for their manifest fields from here on, so the plan (and every
    // re-plan after a loss) counts the slots' KV caches and the draft on the head.
    if let Some(draft) = &setup.draft {
        manifest.manifest.model.draft = Some(std::path::absolute(draft)?);
    }
    if let Some(parallel) = setup.parallel {
        manifest.manifest.server.parallel = parallel;
    }
    let head = manifest.head_index()?;
    check_models(&manifest, setup.model.is_some())?;

    // Ctrl-C or SIGTERM ends the prompt or the server cleanly, so the local nodes are
    // dropped (stopped, or recorded with --keep-nodes) on the way out.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }

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
    let id = ClusterId::of(&manifest, &security);
    let nodes = LocalNodes::start(&id, &specs, setup.keep_nodes);
    bar.finish_and_clear();
    let nodes = nodes?;
    report::nodes(&nodes);
    let addrs: Vec<(String, String)> = nodes
        .running()
        .map(|n| (n.name.clone(), n.addr.clone()))
        .collect();
    let addr_of = move |name: &str| {
        addrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
    };

    let m = &manifest.manifest;
    let head_device = &m.devices[head];
    let head_model = manifest.model_path(&head_device.name);
    let engine_args = EngineArgs {
        model: Some(head_model.clone()),
        hf_repo: None,
        threads: head_device.threads,
        backend: head_device.backend.clone(),
        gpu_layers: None,
        gpu_backend: head_device.gpu_backend.clone(),
    };
    // With profiles from a file, a dry run needs neither a backend nor a transport, and
    // the model is read for its shapes alone; otherwise the engine loads it, once.
    let fixtures_only = m.policy.profiles.is_some() && setup.dry_run;
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
                max: setup
                    .draft_max
                    .or(m.model.draft_max)
                    .unwrap_or(defaults.max),
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
        draft: draft.as_ref().map(|d| &d.model).or(draft_shapes.as_ref()),
    });
    bar.finish_and_clear();
    let plan = plan?;
    report::plan(&plan, setup.json, setup.verbose, &id)?;
    let (Some(engine), Some(transport)) = (engine, transport) else {
        return Ok(None);
    };
    if setup.dry_run {
        return Ok(None);
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
    let options = ring_options(
        &RingPolicy::of_manifest(&manifest, head),
        &layout_of(&plan),
        LaunchSettings {
            n_ctx,
            micro_batches: match setup.micro_batches.or(policy.micro_batches) {
                Some(m) => m.count(),
                None => micro_batches_from_env()?,
            },
            // The draft's weights and KV caches live on the head beside its windows.
            head_reserved: draft
                .as_ref()
                .map_or(0, |d| d.memory_bytes(n_ctx, policy.batch, parallel)),
            // A draft's tokens are verified from rows' logits after the fact.
            row_logits: draft.is_some(),
            security,
        },
    );
    let cluster = Cluster {
        manifest,
        engine,
        transport,
        draft,
        plan,
        id,
        options,
        interrupted,
        addr_of: Box::new(addr_of),
        _nodes: nodes,
    };
    if cluster.engine.gpu.is_none() {
        report::no_head_gpu(cluster.head_gpu_layers());
    }
    Ok(Some(cluster))
}

/// Every model file the head and the local devices open exists, or an error says which
/// is missing and how to get it.
fn check_models(manifest: &LoadedManifest, overridden: bool) -> anyhow::Result<()> {
    for d in manifest
        .manifest
        .devices
        .iter()
        .filter(|d| d.local || d.head)
    {
        let path = manifest.model_path(&d.name);
        if !path.exists() && overridden {
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
