//! `prima node`: the daemon a ring device runs. It maps its own copy of the model, waits
//! for a head, and runs the layer windows the head assigns it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use prima_abi::transport::TransportConfig;
use prima_cluster::discovery::{Advertiser, NodeRecord, DEFAULT_CLUSTER};
use prima_cluster::profile::{hostname, ProfileOptions};
use prima_cluster::prp::budget::MemBudget;
use prima_cluster::prp::key::LinkSecurity;
use prima_cluster::prp::node::{serve, NodeConfig, NodeGpu};
use prima_cluster::prp::protocol::PROTOCOL_VERSION;
use prima_core::plugin::load_transport;

use super::engine::{Engine, EngineArgs};
use super::keygen::{describe, KeyArgs};

/// Largest frame a node accepts: a full prompt batch of activations of a large model.

#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    /// Address to listen on for the head and the previous device, e.g. 0.0.0.0:9000
    /// (port 0 picks a free port, printed on stderr).
    #[arg(long)]
    listen: String,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    key: KeyArgs,
    /// Bytes of weights to keep resident (e.g. 2G); layers beyond it are streamed from
    /// disk each token. `auto` (the default): what this device has available, inside its
    /// cgroup limits, less its KV cache and buffers; `none`: no limit.
    #[arg(long, default_value = "auto", value_parser = MemBudget::parse)]
    mem_budget: MemBudget,
    /// Transport plugin to use (default: the first one found).
    #[arg(long)]
    transport: Option<String>,
    /// Announce this node on the LAN (mDNS) for `prima discover` and manifests with
    /// [discovery]; the announcement is withdrawn when the node exits.
    #[arg(long)]
    advertise: bool,
    /// The cluster to announce this node in (with --advertise).
    #[arg(long, requires = "advertise", default_value = DEFAULT_CLUSTER)]
    cluster: String,
    /// The device name to announce, as manifests call it (default: the host name).
    #[arg(long, requires = "advertise")]
    name: Option<String>,
}

pub fn run(args: NodeArgs) -> anyhow::Result<()> {
    // Before the model is mapped: a node without a key has nothing to do.
    let security = args.key.security()?;
    let engine = Engine::open_planned(&args.engine)?;
    let transport = load_transport(
        args.transport.as_deref(),
        TransportConfig {
            max_frame_bytes: prima_cluster::controller::MAX_FRAME_BYTES,
        },
    )?;
    let listener = transport
        .transport
        .listen(args.listen.as_str().into())
        .into_result()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let backend_desc = engine.describe_backends();
    eprintln!(
        "node: listening on {} | {} | {} | {}",
        listener.local_addr(),
        engine.path.display(),
        backend_desc,
        describe(&security)
    );
    let _advertiser = if args.advertise {
        Some(advertise(&args, &listener.local_addr(), &security)?)
    } else {
        None
    };
    let profiler = || -> Result<serde_json::Value, String> {
        let options = ProfileOptions::default();
        let report = prima_cluster::profile::profile_with(
            &engine.backend,
            engine.gpu.as_ref(),
            &engine.path,
            &options,
        )
        .map_err(|e| e.to_string())?;
        let flag = match args.mem_budget {
            MemBudget::Bytes(b) => Some(b),
            MemBudget::Auto | MemBudget::Off => None,
        };
        let profile = prima_cluster::profile::with_budget(report.profile, flag);
        serde_json::to_value(&profile).map_err(|e| e.to_string())
    };
    let config = NodeConfig {
        mem_budget: args.mem_budget,
        host: hostname(),
        backend_desc,
        profiler: &profiler,
        security,
        gpu: engine.gpu.as_ref().map(|g| NodeGpu {
            backend: &g.backend,
            layers: args.engine.gpu_layers,
        }),
    };
    serve(
        &engine.model,
        &engine.backend.backend,
        &transport.transport,
        listener,
        &config,
    )?;
    Ok(())
}

/// Starts announcing this node, and withdraws the announcement on Ctrl-C or SIGTERM
/// before exiting (the node has nothing else to clean up); it is also withdrawn when the
/// returned handle is dropped.
fn advertise(
    args: &NodeArgs,
    listen: &str,
    security: &LinkSecurity,
) -> anyhow::Result<Arc<Mutex<Advertiser>>> {
    let addr: SocketAddr = listen.parse().map_err(|_| {
        anyhow::anyhow!(
            "--advertise: the transport listens on {listen:?}, not an IP address and port"
        )
    })?;
    let record = NodeRecord {
        name: args.name.clone().unwrap_or_else(hostname),
        cluster: args.cluster.clone(),
        protocol: PROTOCOL_VERSION,
        prima_version: env!("CARGO_PKG_VERSION").to_string(),
        listen: listen.to_string(),
        // The key's fingerprint, so a head of another cluster leaves this node out.
        key: match security {
            LinkSecurity::Key(key) => Some(key.fingerprint()),
            LinkSecurity::Insecure => None,
        },
    };
    anyhow::ensure!(!record.name.trim().is_empty(), "--name must not be empty");
    anyhow::ensure!(
        !record.cluster.trim().is_empty(),
        "--cluster must not be empty"
    );
    let advertiser = Arc::new(Mutex::new(Advertiser::start(&record, addr)?));
    let on_signal = advertiser.clone();
    ctrlc::set_handler(move || {
        if let Ok(mut a) = on_signal.lock() {
            a.stop();
        }
        std::process::exit(0);
    })?;
    eprintln!(
        "node: advertising '{}' in cluster '{}' ({})",
        record.name,
        record.cluster,
        advertiser
            .lock()
            .map(|a| a.instance().to_string())
            .unwrap_or_default()
    );
    Ok(advertiser)
}
