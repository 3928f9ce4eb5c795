//! The head of the ring (device 0): embeds the tokens, runs its own windows, sends the
//! hidden states round the ring k times per batch, and applies the output head. Input and
//! output never leave it.
//!
//! A health thread pings every node while the ring runs; when the ring breaks, its verdict
//! names the device that died (its control connection is gone or silent), not the
//! neighbours that merely lost their link to it.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prima_abi::backend::BackendBox;
use prima_abi::transport::{relayed, TransportBox, NO_TIMEOUT};
use prima_core::batch::{plan_batches, BatchForward, BatchRowLogits, Piece, SeqSpan, SeqTokens};
use prima_core::generate::{Forward, RowLogits};
use prima_core::model::{GpuLayers, Model, Session};

use super::budget::{report_budget, ring_device_budget, MemBudget};
use super::counters::PassMeter;
use super::expert_cache::{ExpertCache, ExpertCacheStats, ExpertHints, PREDICT_DEFAULT};
use super::key::LinkSecurity;
use super::link::{
    decode_activations, expect_control, protocol_error, recv_control, recv_frame, send_control,
    send_frame,
};
use super::micro_batch::MicroBatchTuner;
use super::probe::{probe, LinkProbe};
use super::protocol::{
    encode_activations_for, encode_tokens, read_logits, read_payload, Activations, Control,
    MemoryBaseline, ModelFingerprint, NextHop, OutputSetup, PassStats, ProtocolError, Ready,
    ReleaseMethod, ReleasePolicy, Role, RoundWindow, Setup, WireType, PROTOCOL_VERSION,
};
use super::residency::Residency;
use super::secure::{Link, LinkListener};
use super::{assign_windows, gpu_layers_of, RingError};

/// Setup steps (connecting, nodes warming their windows) wait this long at most.
const SETUP_TIMEOUT_MS: u64 = 120_000;
/// How often the health thread pings each node, and how long a node may take to answer.
const PING_EVERY: Duration = Duration::from_millis(300);
const PONG_TIMEOUT_MS: u64 = 5_000;

/// The ring's GPU layers: n_m per window of each device in ring order (the head's first;
/// missing entries are 0), and the head's own GPU backend (without one the head runs its
/// share on its backend).
#[derive(Default, Clone)]
pub struct RingGpus<'m> {
    pub head: Option<&'m BackendBox>,
    pub n: Vec<usize>,
}

/// How the ring runs.
#[derive(Debug, Clone)]
pub struct RingOptions {
    /// Positions of each slot.
    pub n_ctx: usize,
    /// Rows of one batch, all slots together.
    pub n_batch: usize,
    /// Independent contexts every device keeps (a KV cache each, so `n_slots × n_ctx`
    /// positions of its layers): continuous batching's slots.
    pub n_slots: usize,
    pub prefetch: bool,
    pub release: ReleasePolicy,
    pub release_method: ReleaseMethod,
    pub wire: WireType,
    /// The head's own budget for resident weights (`auto`: what it has available less
    /// its KV cache, buffers and output head).
    pub mem_budget: MemBudget,
    /// Where the head accepts the last device's data connection.
    pub listen: String,
    /// How each node (in ring order) reaches the device after it, where that is not how
    /// the head reaches it (a ring across networks); empty: as the head does.
    pub next_routes: Vec<NextRoute>,
    /// How the links to the nodes are protected (the nodes must hold the same key).
    pub security: LinkSecurity,
    /// Micro-batches a [`BatchForward::eval_batch`] keeps in flight (see [`RingHead`]);
    /// `None`: from one to one per device, whichever the head measures fastest
    /// ([`super::micro_batch`]). Default 1, one batch at a time: on a loopback ring of
    /// three on two shared cores, more paid only at 2 concurrent requests (`cargo xtask
    /// bench-serve --ring --micro-batches default,2,tuned` measures it).
    pub micro_batches: Option<usize>,
    /// Bytes the head's process holds beside this model (a draft model, its KV cache
    /// per slot), kept out of an `auto` `mem_budget`.
    pub head_reserved: u64,
    /// The device that runs the model's last layer also runs the output layer and sends
    /// back the logits the head asks for (`None`: the head runs it, as the paper does).
    pub output: Option<OutputSetup>,
}

/// How a node reaches the device after it in the ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextRoute {
    /// At the address the head reaches that node at; the last node reaches the head at
    /// the address its control connection came from.
    AsHead,
    /// At this address (e.g. `TARGET via RELAY`).
    Addr(String),
    /// The head's data listener through the relay leg at this address; the head must
    /// then listen on its own address in its network, not on 0.0.0.0.
    HeadVia(String),
}

impl Default for RingOptions {
    fn default() -> Self {
        RingOptions {
            n_ctx: 4096,
            n_batch: 512,
            n_slots: 1,
            prefetch: true,
            release: ReleasePolicy::Mru,
            release_method: ReleaseMethod::Pageout,
            wire: WireType::F32,
            mem_budget: MemBudget::Auto,
            listen: "0.0.0.0:0".into(),
            next_routes: Vec::new(),
            security: LinkSecurity::Insecure,
            micro_batches: Some(1),
            head_reserved: 0,
            output: None,
        }
    }
}

/// One node as the head sees it.
struct NodeLink {
    device: usize,
    addr: String,
    control: Link,
    /// Held for one request–answer exchange on `control`.
    exchange: Mutex<()>,
}

impl NodeLink {
    fn ask(&self, msg: &Control, timeout_ms: u64) -> Result<Option<Control>, RingError> {
        let _turn = self.exchange.lock().unwrap_or_else(|e| e.into_inner());
        send_control(&self.control, msg)?;
        recv_control(&self.control, timeout_ms)
    }
}

/// A broken ring: the device and why.
#[derive(Debug, Clone)]
struct Verdict {
    device: usize,
    addr: String,
    reason: String,
}

struct Shared {
    nodes: Vec<NodeLink>,
    /// The head's data connections: to device 1, and from the last device. Here so that
    /// the health thread can close them once it has a verdict, which ends a send or
    /// receive the head is blocked in (a frame bigger than the socket buffers, sent to a
    /// frozen node, would otherwise never finish).
    data_out: Link,
    data_in: Link,
    verdict: Mutex<Option<Verdict>>,
    stop: AtomicBool,
}

impl Shared {
    /// Ends any send or receive on the head's data connections.
    fn close_data(&self) {
        self.data_out.close();
        self.data_in.close();
    }

    fn verdict(&self) -> Option<Verdict> {
        self.verdict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Statistics of one device, as collected after a generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceStats {
    pub device: usize,
    pub addr: String,
    pub memory: MemoryBaseline,
    /// Peak memory pressure while running, (baseline − lowest MemAvailable) ÷ MemTotal.
    pub peak_memory_pressure: f64,
    pub passes: Vec<PassStats>,
}

/// What one node reported when it joined.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub device: usize,
    pub addr: String,
    pub ready: Ready,
}

/// Asks the node at `addr` for its device profile (a short session of its own).
pub fn request_profile(
    transport: &TransportBox,
    addr: &str,
    timeout_ms: u64,
    security: &LinkSecurity,
) -> Result<serde_json::Value, RingError> {
    profile_session(transport, addr, timeout_ms, security, None).map(|(p, _)| p)
}

/// [`request_profile`], after timing the link to the node with pings, empty and padded
/// to `probe_bytes` (a hidden state's size): what Halda's link terms are built from.
pub fn request_profile_and_probe(
    transport: &TransportBox,
    addr: &str,
    timeout_ms: u64,
    security: &LinkSecurity,
    probe_bytes: usize,
) -> Result<(serde_json::Value, LinkProbe), RingError> {
    let (profile, link) =
        profile_session(transport, addr, timeout_ms, security, Some(probe_bytes))?;
    let link = link.ok_or_else(|| RingError::Setup(format!("{addr}: the link was not timed")))?;
    Ok((profile, link))
}

fn profile_session(
    transport: &TransportBox,
    addr: &str,
    timeout_ms: u64,
    security: &LinkSecurity,
    probe_bytes: Option<usize>,
) -> Result<(serde_json::Value, Option<LinkProbe>), RingError> {
    let conn = Link::connect(transport, addr, 10_000, security)?;
    send_control(
        &conn,
        &Control::Hello {
            protocol: PROTOCOL_VERSION,
            role: Role::Control,
        },
    )?;
    let link = probe_bytes.map(|bytes| probe(&conn, bytes)).transpose()?;
    send_control(&conn, &Control::ProfileRequest)?;
    let reply = expect_control(&conn, timeout_ms, "a profile")?;
    conn.close();
    match reply {
        Control::Profile { profile } => Ok((profile, link)),
        Control::Refused { reason } => Err(RingError::Setup(format!(
            "{addr}: profiling failed: {reason}"
        ))),
        other => Err(RingError::Unexpected {
            peer: addr.to_string(),
            expected: "a profile",
            got: format!("{other:?}"),
        }),
    }
}

/// A connection to a node that failed: the device is gone, unless it answered and refused
/// the link (another key, a plain link), which says so itself.
fn lost_at_connect(e: RingError, device: usize, addr: &str) -> RingError {
    match e {
        RingError::Transport(reason) => RingError::DeviceLost {
            device,
            addr: addr.to_string(),
            reason,
        },
        other => other,
    }
}

/// The head: a [`Forward`] (slot 0) and a [`BatchForward`] whose layers run round the
/// ring.
///
/// A [`BatchForward::eval_batch`] of several entries is cut into micro-batches (entries
/// in order, about as many tokens each) that go round the ring at the same time, each
/// its own frames: while device 1 computes micro-batch 1, the head computes micro-batch
/// 2, and so on, instead of all but one device waiting. Micro-batches hold different
/// slots, so they touch different KV caches and any order of their frames gives the
/// logits one batch gives. How many: [`RingOptions::micro_batches`], at most one per
/// entry.
pub struct RingHead<'m> {
    session: Session<'m>,
    ring: Passes<'m>,
    health: Option<JoinHandle<()>>,
    /// How many micro-batches an evaluation is cut into; `None`: as `tuner` finds
    /// fastest.
    micro_batches: Option<usize>,
    tuner: MicroBatchTuner,
    memory: MemoryBaseline,
    nodes: Vec<NodeInfo>,
}

/// What sends a batch round the ring: the head's windows, the data connections, the
/// pass counter and the statistics of every pass.
struct Passes<'m> {
    residency: Residency,
    /// The head's resident-expert cache, when it streams experts (also the session's
    /// expert policy).
    experts: Option<Arc<ExpertCache<'m>>>,
    rounds: usize,
    wire: WireType,
    /// The last device runs the output layer and returns the logits of the rows the head
    /// lists (`None`: the head computes them from the hidden states).
    remote_output: Option<OutputSetup>,
    /// The head runs no layer in round 0, so that round's frames carry the batch's token
    /// ids ([`WireType::Tokens`]) and the next device embeds them.
    tokens_first: bool,
    /// The logits the last device returned for the batch just back.
    logits: Vec<f32>,
    shared: Arc<Shared>,
    /// Where the last device's frames are read.
    arrivals: Arrivals,
    /// The next batch's number: every batch (micro-batch) gets its own, which its frames
    /// carry round the ring.
    seq: u64,
    frame: Vec<u8>,
    passes: Vec<PassStats>,
    meter: PassMeter,
}

/// Where the head reads the frames the last device sends back.
enum Arrivals {
    /// On the evaluating thread, while one batch at a time goes round: nothing can come
    /// back while the head sends, and a frame reaches the head with one thread woken
    /// instead of two (a wake-up costs tens of microseconds, k of them per token).
    Direct,
    /// From the reader thread, once several batches have been in flight together.
    Reader {
        incoming: mpsc::Receiver<Result<Vec<u8>, RingError>>,
        thread: Option<JoinHandle<()>>,
    },
}

/// A pass sent round the ring and not back yet: its batch, round and what the head
/// measured of it.
struct Sent {
    seq: u64,
    round: usize,
    n_tokens: usize,
    expert_hits: u64,
    expert_misses: u64,
    expert_streamed_bytes: u64,
    compute_ms: f64,
    send_ms: f64,
    major_faults: u64,
    disk_read_bytes: u64,
    mem_available: u64,
}

/// A micro-batch in the ring: its group of entries, which of the group's batches, and
/// that batch's spans (to set up the head's session again when its frame comes back).
struct Flying {
    group: usize,
    batch: usize,
    sent: Sent,
    spans: Vec<SeqSpan>,
    /// The rows whose logits the last device returns (when it runs the output layer),
    /// and the place of the first in the session's entry logits.
    logit_rows: Vec<u32>,
    first_entry_row: usize,
}

impl<'m> RingHead<'m> {
    /// Sets up the ring: device 0 is this head, device m ≥ 1 the node at `nodes[m - 1]`;
    /// `windows[m]` is device m's window size w_m.
    pub fn connect(
        model: &'m Model,
        backend: &'m BackendBox,
        transport: &TransportBox,
        nodes: &[String],
        windows: &[usize],
        options: &RingOptions,
    ) -> Result<RingHead<'m>, RingError> {
        let none = RingGpus::default();
        RingHead::connect_with_gpus(model, backend, transport, nodes, windows, &none, options)
    }

    /// [`RingHead::connect`] with the paper's n_m: `gpus.n[m]` of each of device m's
    /// windows run on its GPU (the head's on `gpus.head`).
    pub fn connect_with_gpus(
        model: &'m Model,
        backend: &'m BackendBox,
        transport: &TransportBox,
        nodes: &[String],
        windows: &[usize],
        gpus: &RingGpus<'m>,
        options: &RingOptions,
    ) -> Result<RingHead<'m>, RingError> {
        if windows.len() != nodes.len() + 1 {
            return Err(RingError::Plan(format!(
                "{} window sizes for {} devices (the head and {} nodes); give one per device, the head's first",
                windows.len(),
                nodes.len() + 1,
                nodes.len()
            )));
        }
        if !options.wire.carries_hidden_states() {
            return Err(RingError::Plan(
                "hidden states travel as f32 or f16; token ids are a frame's kind, not a ring's wire type".into(),
            ));
        }
        let n_layers = model.hparams().n_layers;
        let n_gpu: Vec<usize> = (0..windows.len())
            .map(|m| gpus.n.get(m).copied().unwrap_or(0))
            .collect();
        let plan = assign_windows(n_layers, windows, &n_gpu)?;
        let gpu_of_device = |m: usize| -> Vec<usize> {
            plan.iter()
                .filter(|w| w.device == m)
                .map(|w| w.gpu_layers)
                .collect()
        };
        let rounds = plan.iter().map(|w| w.round + 1).max().unwrap_or(1);
        let of_device = |m: usize| -> Vec<RoundWindow> {
            plan.iter()
                .filter(|w| w.device == m)
                .map(|w| RoundWindow {
                    round: w.round,
                    layers: w.layers.clone(),
                })
                .collect()
        };
        let transport_err =
            |e: abi_stable::std_types::RString| RingError::Transport(e.into_string());

        let listener = transport
            .listen(options.listen.as_str().into())
            .into_result()
            .map_err(transport_err)?;
        let listener = LinkListener::start(listener, options.security.clone(), "head")?;
        let port = listener
            .local_addr()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| {
                RingError::Setup(format!("cannot tell the port of {}", listener.local_addr()))
            })?;

        // Say hello to every node before any node is told to connect to its neighbour, so
        // each node accepts the head's control connection first.
        let mut links = Vec::with_capacity(nodes.len());
        for (i, addr) in nodes.iter().enumerate() {
            let device = i + 1;
            let control = Link::connect(transport, addr, 10_000, &options.security)
                .map_err(|e| lost_at_connect(e, device, addr))?;
            send_control(
                &control,
                &Control::Hello {
                    protocol: PROTOCOL_VERSION,
                    role: Role::Control,
                },
            )?;
            links.push(NodeLink {
                device,
                addr: addr.clone(),
                control,
                exchange: Mutex::new(()),
            });
        }
        let fingerprint = ModelFingerprint::of(model.gguf());
        if !options.next_routes.is_empty() && options.next_routes.len() != nodes.len() {
            return Err(RingError::Plan(format!(
                "{} next-hop routes for {} nodes",
                options.next_routes.len(),
                nodes.len()
            )));
        }
        for link in &links {
            let route = options
                .next_routes
                .get(link.device - 1)
                .unwrap_or(&NextRoute::AsHead);
            let next = match (route, nodes.get(link.device)) {
                (NextRoute::Addr(addr), _) => NextHop::Node { addr: addr.clone() },
                (NextRoute::HeadVia(relay), _) => {
                    let me = listener.local_addr().to_string();
                    if me.starts_with("0.0.0.0:") || me.starts_with("[::]:") {
                        return Err(RingError::Setup(format!(
                            "device {} reaches the head through relay {relay}, so the head must listen on its address in its network, not {me}",
                            link.device
                        )));
                    }
                    NextHop::Node {
                        addr: relayed(&me, relay),
                    }
                }
                (NextRoute::AsHead, Some(addr)) => NextHop::Node { addr: addr.clone() },
                (NextRoute::AsHead, None) => NextHop::Head { port },
            };
            let setup = Setup {
                protocol: PROTOCOL_VERSION,
                model: fingerprint.clone(),
                device: link.device,
                n_devices: nodes.len() + 1,
                rounds,
                windows: of_device(link.device),
                gpu_layers: match gpu_of_device(link.device) {
                    n if n.iter().all(|&n| n == 0) => Vec::new(),
                    n => n,
                },
                n_ctx: options.n_ctx,
                n_batch: options.n_batch,
                n_slots: options.n_slots,
                next,
                prefetch: options.prefetch,
                release: options.release,
                release_method: options.release_method,
                wire: options.wire,
                output: options.output,
            };
            send_control(&link.control, &Control::Setup(Box::new(setup)))?;
        }

        let memory = MemoryBaseline::now();
        let head_windows = of_device(0);
        // The output layer runs on a node when asked and the head does not run the last
        // layer itself (only then is a node's window the model's last).
        let remote_output = options
            .output
            .filter(|_| !head_windows.iter().any(|w| w.layers.end == n_layers));
        let held: Vec<usize> = head_windows.iter().flat_map(|w| w.layers.clone()).collect();
        let tokens_first = !head_windows
            .iter()
            .any(|w| w.round == 0 && !w.layers.is_empty());
        let head_gpu = gpu_of_device(0);
        let on_gpu = match gpus.head {
            Some(_) => gpu_layers_of(head_windows.iter().map(|w| &w.layers), |i| head_gpu[i]),
            None => Vec::new(),
        };
        let mut session = Session::with_split(
            model,
            backend,
            gpus.head.map(|backend| GpuLayers {
                backend,
                layers: &on_gpu,
            }),
            options.n_ctx,
            options.n_batch,
            options.n_slots,
            &held,
        )?;
        // The GPU layers' keys and values live in VRAM, not in this budget.
        let budget = ring_device_budget(
            options.mem_budget,
            model,
            held.len() - on_gpu.len(),
            true,
            options.n_ctx,
            options.n_batch,
            options.n_slots,
        )
        .map(|mut b| {
            if b.available.is_some() {
                b.bytes = b.bytes.saturating_sub(options.head_reserved);
                b.margin = b.margin.saturating_add(options.head_reserved);
            }
            b
        });
        // As on a node: a mixture of experts keeps its layers' shared parts and hottest
        // experts and streams the other experts per use, when the shared parts fit.
        let cpu_held: Vec<usize> = held
            .iter()
            .copied()
            .filter(|il| !on_gpu.contains(il))
            .collect();
        let experts = budget.as_ref().and_then(|b| {
            let hints = ExpertHints {
                prefetch: options.prefetch,
                release: options.release,
                method: options.release_method,
                predict: PREDICT_DEFAULT,
                persist: true,
            };
            ExpertCache::plan_layers(model, &cpu_held, b.bytes, None, hints).map(Arc::new)
        });
        let residency = Residency::plan_split(
            model,
            &head_windows,
            &on_gpu,
            budget
                .as_ref()
                .filter(|_| experts.is_none())
                .map(|b| b.bytes),
            options.prefetch,
            options.release,
            options.release_method,
        );
        report_budget("head", budget.as_ref(), &residency);
        match (&experts, &budget) {
            (Some(cache), Some(b)) => {
                eprintln!("head: memory: {b}; {}", cache.describe());
                cache.warm();
                session.set_expert_policy(Some(cache.clone()));
            }
            _ => residency.warm(model),
        }

        let data_out = Link::connect(transport, &nodes[0], 10_000, &options.security)
            .map_err(|e| lost_at_connect(e, 1, &nodes[0]))?;
        send_control(
            &data_out,
            &Control::Hello {
                protocol: PROTOCOL_VERSION,
                role: Role::Data,
            },
        )?;

        let mut infos = Vec::with_capacity(links.len());
        for link in &links {
            match expect_control(&link.control, SETUP_TIMEOUT_MS, "the node's ready message") {
                Ok(Control::Ready(ready)) => infos.push(NodeInfo {
                    device: link.device,
                    addr: link.addr.clone(),
                    ready,
                }),
                Ok(Control::Refused { reason }) => {
                    return Err(RingError::Refused {
                        device: link.device,
                        addr: link.addr.clone(),
                        reason,
                    })
                }
                Ok(other) => {
                    return Err(RingError::Unexpected {
                        peer: link.addr.clone(),
                        expected: "a ready message",
                        got: format!("{other:?}"),
                    })
                }
                Err(e) => {
                    return Err(RingError::DeviceLost {
                        device: link.device,
                        addr: link.addr.clone(),
                        reason: e.to_string(),
                    })
                }
            }
        }
        let data_in = loop {
            let conn = listener.accept(SETUP_TIMEOUT_MS).ok_or_else(|| {
                RingError::Setup("the last device did not connect back to the head".into())
            })?;
            match recv_control(&conn, 5_000) {
                Ok(Some(Control::Hello {
                    role: Role::Data, ..
                })) => break conn,
                other => tracing::warn!(peer = %conn.peer(), "unexpected connection {other:?}"),
            }
        };

        let links_len = links.len();
        let shared = Arc::new(Shared {
            nodes: links,
            data_out,
            data_in,
            verdict: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let health = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("prima-ring-health".into())
                .spawn(move || health_loop(&shared))
                .map_err(|e| RingError::Setup(format!("cannot start the health thread: {e}")))?
        };
        Ok(RingHead {
            session,
            micro_batches: options.micro_batches.map(|m| m.max(1)),
            tuner: MicroBatchTuner::new(links_len + 1),
            ring: Passes {
                residency,
                experts,
                rounds,
                wire: options.wire,
                remote_output,
                tokens_first,
                logits: Vec::new(),
                shared,
                arrivals: Arrivals::Direct,
                seq: 0,
                frame: Vec::new(),
                passes: Vec::new(),
                meter: PassMeter::new(),
            },
            health: Some(health),
            memory,
            nodes: infos,
        })
    }

    /// Rounds per token (k).
    pub fn rounds(&self) -> usize {
        self.ring.rounds
    }

    /// How many micro-batches each [`BatchForward::eval_batch`] is cut into from now
    /// on, as [`RingOptions::micro_batches`] (`None`: tuned, with what the tuner has
    /// measured so far).
    pub fn set_micro_batches(&mut self, n: Option<usize>) {
        self.micro_batches = n.map(|m| m.max(1));
    }

    /// The nodes, as they reported when they joined.
    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// Collects (and clears) the per-pass statistics of every device, the head first.
    pub fn collect_stats(&mut self) -> Result<Vec<DeviceStats>, RingError> {
        let passes = std::mem::take(&mut self.ring.passes);
        let mut all = vec![DeviceStats {
            device: 0,
            addr: "head".into(),
            memory: self.memory,
            peak_memory_pressure: self.memory.peak_pressure(&passes),
            passes,
        }];
        for link in &self.ring.shared.nodes {
            match link.ask(&Control::StatsRequest, PONG_TIMEOUT_MS)? {
                Some(Control::Stats { passes, memory }) => all.push(DeviceStats {
                    device: link.device,
                    addr: link.addr.clone(),
                    memory,
                    peak_memory_pressure: memory.peak_pressure(&passes),
                    passes,
                }),
                other => {
                    return Err(RingError::Unexpected {
                        peer: link.addr.clone(),
                        expected: "statistics",
                        got: format!("{other:?}"),
                    })
                }
            }
        }
        Ok(all)
    }

    /// Ends the session on every node; with `exit` the node processes exit too.
    pub fn shutdown(mut self, exit: bool) {
        self.stop(exit);
    }

    fn stop(&mut self, exit: bool) {
        let shared = &self.ring.shared;
        shared.stop.store(true, Ordering::Release);
        if let Some(h) = self.health.take() {
            let _ = h.join();
        }
        for link in &shared.nodes {
            let _ = send_control(&link.control, &Control::Shutdown { exit });
            link.control.close();
        }
        shared.close_data();
        if let Arrivals::Reader { thread, .. } = &mut self.ring.arrivals {
            if let Some(h) = thread.take() {
                let _ = h.join();
            }
        }
    }
}

impl Passes<'_> {
    /// Turns a transport failure into the health thread's verdict on who broke the ring,
    /// waiting a little for it.
    fn broken(&self, cause: RingError) -> RingError {
        let deadline = Instant::now() + Duration::from_millis(PONG_TIMEOUT_MS + 1_000);
        while Instant::now() < deadline {
            if let Some(v) = self.shared.verdict() {
                return RingError::DeviceLost {
                    device: v.device,
                    addr: v.addr,
                    reason: v.reason,
                };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        cause
    }

    /// Every round of the batch in flight in `session` round the ring, one after
    /// another; the last device returns the logits of `logit_rows` into `self.logits`
    /// when it runs the output layer.
    fn batch(
        &mut self,
        session: &mut Session<'_>,
        logit_rows: &[u32],
        tokens: &[u32],
    ) -> Result<(), RingError> {
        let seq = self.next_seq();
        for round in 0..self.rounds {
            let sent = self.send(session, seq, round, logit_rows, Some(tokens))?;
            let (frame, wait_ms) = self.receive()?;
            let peer = self.shared.data_in.peer().into_string();
            let (h, _, payload) = decode_activations(&frame, &peer)?;
            if h.seq != seq || h.round as usize != round {
                return Err(RingError::Unexpected {
                    peer,
                    expected: "the activations just sent round the ring",
                    got: format!("seq {} round {}", h.seq, h.round),
                });
            }
            let hp = session.model().hparams();
            let (n_embd, n_vocab) = (hp.n_embd, hp.n_vocab);
            let section = read_payload(&h, payload, n_embd, session.hidden_mut())
                .map_err(protocol_error(&peer))?;
            if round + 1 == self.rounds {
                self.take_logits(section, logit_rows.len(), n_vocab)
                    .map_err(protocol_error(&peer))?;
            }
            self.record(sent, wait_ms);
        }
        Ok(())
    }

    /// The logits of `rows` rows from the last device's frame into `self.logits`, when
    /// it runs the output layer.
    fn take_logits(
        &mut self,
        section: &[u8],
        rows: usize,
        n_vocab: usize,
    ) -> Result<(), ProtocolError> {
        if self.remote_output.is_none() || rows == 0 {
            return Ok(());
        }
        self.logits.resize(rows * n_vocab, 0.0);
        read_logits(section, rows, n_vocab, &mut self.logits)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Runs the head's windows of `round` over the batch in flight in `session` and
    /// sends it on as batch `seq`: in round 0 as its `tokens` when the head runs no layer
    /// then (`tokens` are the batch's; `None` past round 0).
    fn send(
        &mut self,
        session: &mut Session<'_>,
        seq: u64,
        round: usize,
        logit_rows: &[u32],
        tokens: Option<&[u32]>,
    ) -> Result<Sent, RingError> {
        let model = session.model();
        let n_tokens: usize = session.batch_spans().iter().map(|s| s.len).sum();
        let experts_before = self.expert_stats();
        let run = self
            .residency
            .run_round(model, session, &self.meter, round)?;
        let experts_after = self.expert_stats();

        let header = Activations {
            seq,
            n_tokens: n_tokens as u32,
            round: round as u16,
            wire: self.wire,
            logit_rows: 0,
        };
        // The pass's counters are read before the send: the send wakes the next device,
        // and on a shared machine anything this thread still does afterwards competes
        // with that device for the cores (the page hints below are the exception: their
        // point is to overlap others' compute; their reads count in the next pass).
        let (disk_read_bytes, mem_available) = self.meter.end_pass();
        let sending = Instant::now();
        let (spans, hidden) = session.outgoing()?;
        let rows = if self.remote_output.is_some() {
            logit_rows
        } else {
            &[]
        };
        match tokens.filter(|_| round == 0 && self.tokens_first) {
            Some(tokens) => encode_tokens(&mut self.frame, &header, spans, rows, tokens),
            None => encode_activations_for(&mut self.frame, &header, spans, rows, hidden),
        }
        if let Err(e) = send_frame(&self.shared.data_out, &self.frame) {
            return Err(self.broken(e));
        }
        let send_ms = sending.elapsed().as_secs_f64() * 1e3;
        if let Some(i) = run.index {
            self.residency.after_window(model, i);
        }
        Ok(Sent {
            seq,
            round,
            n_tokens,
            expert_hits: experts_after.hits - experts_before.hits,
            expert_misses: experts_after.misses - experts_before.misses,
            expert_streamed_bytes: experts_after.streamed_bytes - experts_before.streamed_bytes,
            compute_ms: run.compute_ms,
            send_ms,
            major_faults: run.major_faults,
            disk_read_bytes,
            mem_available,
        })
    }

    /// What the head's expert cache has served (zeros without one).
    fn expert_stats(&self) -> ExpertCacheStats {
        self.experts.as_ref().map(|c| c.stats()).unwrap_or_default()
    }

    /// The next frame from the last device, and how long the head waited for it.
    fn receive(&mut self) -> Result<(Vec<u8>, f64), RingError> {
        let waiting = Instant::now();
        // Sleeps until a frame comes back; if the ring breaks first, the health thread
        // closes the connection and the verdict names who broke it.
        let frame = match &self.arrivals {
            Arrivals::Direct => loop {
                match recv_frame(&self.shared.data_in, NO_TIMEOUT) {
                    Ok(Some(frame)) => break frame,
                    Ok(None) => {}
                    Err(e) => return Err(self.broken(e)),
                }
            },
            Arrivals::Reader { incoming, .. } => match incoming.recv() {
                Ok(Ok(frame)) => frame,
                Ok(Err(e)) => return Err(self.broken(e)),
                Err(mpsc::RecvError) => {
                    return Err(self.broken(RingError::Transport(
                        "the head's reader thread is gone".into(),
                    )))
                }
            },
        };
        Ok((frame, waiting.elapsed().as_secs_f64() * 1e3))
    }

    /// Hands the reading of the last device's frames to a thread of its own (see
    /// [`read_loop`]), before the first time several batches are in flight; from then
    /// on it reads for good. Called between evaluations, so no frame is half read.
    fn start_reader(&mut self) -> Result<(), RingError> {
        if matches!(self.arrivals, Arrivals::Reader { .. }) {
            return Ok(());
        }
        let (arrived, incoming) = mpsc::channel();
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name("prima-ring-reader".into())
            .spawn(move || read_loop(&shared, &arrived))
            .map_err(|e| RingError::Setup(format!("cannot start the reader thread: {e}")))?;
        self.arrivals = Arrivals::Reader {
            incoming,
            thread: Some(thread),
        };
        Ok(())
    }

    /// Logs a pass that came back after the head waited `wait_ms` for it.
    fn record(&mut self, sent: Sent, wait_ms: f64) {
        self.passes.push(PassStats {
            seq: sent.seq,
            round: sent.round,
            n_tokens: sent.n_tokens,
            wait_ms,
            compute_ms: sent.compute_ms,
            send_ms: sent.send_ms,
            major_faults: sent.major_faults,
            disk_read_bytes: sent.disk_read_bytes,
            mem_available: sent.mem_available,
            expert_hits: sent.expert_hits,
            expert_misses: sent.expert_misses,
            expert_streamed_bytes: sent.expert_streamed_bytes,
        });
    }

    /// Evaluates `seqs` (checked) as micro-batches: each group of entries `groups[g]`
    /// goes through its batches (cut by [`plan_batches`]) one after another, every
    /// group's current batch in the ring at the same time. The groups hold different
    /// slots. The logits land in the session's [`Session::entry_logits`].
    fn micro_batches(
        &mut self,
        session: &mut Session<'_>,
        seqs: &[SeqTokens<'_>],
        groups: &[Range<usize>],
    ) -> Result<(), RingError> {
        let (n_embd, n_vocab) = (
            session.model().hparams().n_embd,
            session.model().hparams().n_vocab,
        );
        let n_batch = session.n_batch();
        // Each group's batches, its pieces numbered as entries of all `seqs`. A group's
        // progress moves only its own slots' positions, so all are planned now.
        let plans: Vec<Vec<Vec<Piece>>> = groups
            .iter()
            .map(|r| {
                let mut batches =
                    plan_batches(&seqs[r.clone()], |slot| session.slot_n_past(slot), n_batch);
                for piece in batches.iter_mut().flatten() {
                    piece.entry += r.start;
                }
                batches
            })
            .collect();
        if groups.len() > 1 {
            self.start_reader()?;
        }
        let mut flying: Vec<Flying> = Vec::with_capacity(groups.len());
        let mut tokens = Vec::new();
        for (group, batches) in plans.iter().enumerate() {
            if let Some(first) = batches.first() {
                flying.push(self.launch(session, seqs, first, group, &mut tokens)?);
            }
        }
        while !flying.is_empty() {
            let (frame, wait_ms) = self.receive()?;
            let peer = self.shared.data_in.peer().into_string();
            let (h, _, payload) = decode_activations(&frame, &peer)?;
            let Some(at) = flying
                .iter()
                .position(|f| f.sent.seq == h.seq && f.sent.round == h.round as usize)
            else {
                return Err(RingError::Unexpected {
                    peer,
                    expected: "activations of a batch in the ring",
                    got: format!("seq {} round {}", h.seq, h.round),
                });
            };
            // Back to this batch: its positions were cut when it started, so starting
            // it again only sets the rows' positions and spans.
            session.begin_spans(&flying[at].spans)?;
            let section = read_payload(&h, payload, n_embd, session.hidden_mut())
                .map_err(protocol_error(&peer))?;
            let next_round = flying[at].sent.round + 1;
            if next_round < self.rounds {
                let seq = flying[at].sent.seq;
                let sent = self.send(session, seq, next_round, &flying[at].logit_rows, None)?;
                let done = std::mem::replace(&mut flying[at].sent, sent);
                self.record(done, wait_ms);
                continue;
            }
            let done = flying.swap_remove(at);
            self.record(done.sent, wait_ms);
            session.finish_batch();
            let pieces = &plans[done.group][done.batch];
            if self.remote_output.is_some() {
                if !done.logit_rows.is_empty() {
                    self.take_logits(section, done.logit_rows.len(), n_vocab)
                        .map_err(protocol_error(&peer))?;
                    session.put_entry_logits(done.first_entry_row, &self.logits)?;
                }
            } else {
                session.entries_logits(pieces, seqs)?;
            }
            if let Some(next) = plans[done.group].get(done.batch + 1) {
                let mut f = self.launch(session, seqs, next, done.group, &mut tokens)?;
                f.batch = done.batch + 1;
                flying.push(f);
            }
        }
        Ok(())
    }

    /// Starts the batch `pieces` of group `group`: embeds its tokens, runs the head's
    /// first window and sends it into the ring.
    fn launch(
        &mut self,
        session: &mut Session<'_>,
        seqs: &[SeqTokens<'_>],
        pieces: &[Piece],
        group: usize,
        tokens: &mut Vec<u32>,
    ) -> Result<Flying, RingError> {
        let spans: Vec<SeqSpan> = pieces.iter().map(|p| p.span).collect();
        session.begin_spans(&spans)?;
        tokens.clear();
        for p in pieces {
            tokens.extend_from_slice(&seqs[p.entry].tokens[p.tokens.clone()]);
        }
        session.embed(tokens)?;
        let (first_entry_row, logit_rows) = match self.remote_output {
            Some(_) => session.entry_rows_wanted(pieces, seqs).unwrap_or_default(),
            None => (0, Vec::new()),
        };
        let seq = self.next_seq();
        let sent = self.send(session, seq, 0, &logit_rows, Some(tokens))?;
        Ok(Flying {
            group,
            batch: 0,
            sent,
            spans,
            logit_rows,
            first_entry_row,
        })
    }
}

/// Cuts `seqs` into at most `m` groups of consecutive entries, about as many tokens
/// each (the cost of a batch grows with its rows): each group closes once its tokens
/// reach an even share of those left.
fn micro_batch_groups(seqs: &[SeqTokens<'_>], m: usize) -> Vec<Range<usize>> {
    let m = m.clamp(1, seqs.len().max(1));
    let mut groups = Vec::with_capacity(m);
    let mut left: usize = seqs.iter().map(|s| s.tokens.len()).sum();
    let mut start = 0;
    while start < seqs.len() {
        let groups_left = m - groups.len();
        let share = left.div_ceil(groups_left);
        let mut end = start;
        let mut tokens = 0;
        // At least one entry; stop before an entry that overshoots the share by more
        // than it falls short without it, or when every later group needs an entry.
        while end < seqs.len() && seqs.len() - end > groups_left - 1 {
            let t = seqs[end].tokens.len();
            if end > start && tokens + t > share && tokens + t - share > share - tokens {
                break;
            }
            tokens += t;
            end += 1;
            if tokens >= share {
                break;
            }
        }
        if groups_left == 1 {
            end = seqs.len();
            tokens = left;
        }
        groups.push(start..end);
        left -= tokens;
        start = end;
    }
    groups
}

impl Forward for RingHead<'_> {
    type Error = RingError;

    fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], RingError> {
        self.session.check_fits(tokens)?;
        let n_batch = self.session.n_batch();
        let Some(last_len) = tokens.chunks(n_batch).last().map(<[u32]>::len) else {
            return Err(RingError::Plan("nothing to evaluate".into()));
        };
        let n_chunks = tokens.len().div_ceil(n_batch);
        for (i, chunk) in tokens.chunks(n_batch).enumerate() {
            let start = self.session.n_past();
            self.session.begin_batch(start, chunk.len())?;
            self.session.embed(chunk)?;
            // Only the last row of the last chunk has its logits taken.
            let last_row = [last_len as u32 - 1];
            let rows: &[u32] = if i + 1 == n_chunks { &last_row } else { &[] };
            self.ring.batch(&mut self.session, rows, chunk)?;
            self.session.finish_batch();
        }
        if self.ring.remote_output.is_some() {
            return Ok(self.session.put_logits(&self.ring.logits));
        }
        Ok(self.session.logits(last_len - 1)?)
    }

    fn n_past(&self) -> usize {
        self.session.n_past()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    /// Only the head's cache is cut here: the next batch carries its start position,
    /// and every node forgets its positions from there.
    fn truncate(&mut self, n: usize) -> Result<(), RingError> {
        Ok(self.session.truncate(n)?)
    }
}

/// Every slot's rows go round the ring together, one frame per round whose spans tell
/// each node which slot's cache and positions its rows attend to.
impl BatchForward for RingHead<'_> {
    type Error = RingError;

    fn n_slots(&self) -> usize {
        self.session.n_slots()
    }

    fn n_ctx(&self) -> usize {
        self.session.n_ctx()
    }

    fn n_batch(&self) -> usize {
        self.session.n_batch()
    }

    fn n_vocab(&self) -> usize {
        self.session.model().hparams().n_vocab
    }

    fn n_past(&self, slot: usize) -> usize {
        self.session.slot_n_past(slot)
    }

    /// As [`Forward::truncate`]: the nodes forget the slot's positions when its next
    /// span starts before them.
    fn truncate(&mut self, slot: usize, n: usize) -> Result<(), RingError> {
        Ok(self.session.truncate_slot(slot, n)?)
    }

    fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], RingError> {
        self.session.check_batch(seqs)?;
        self.session.start_entries(seqs.len());
        self.eval_entries(seqs)
    }
}

/// The last pass brings every row back to the head, so the rows asked for get their
/// logits as each micro-batch comes back, like the entries' last rows do.
impl BatchRowLogits for RingHead<'_> {
    fn eval_batch_rows(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<&[f32], RingError> {
        self.session.check_batch(seqs)?;
        self.session.start_entry_rows(seqs, rows)?;
        self.eval_entries(seqs)
    }
}

impl RingHead<'_> {
    /// Evaluates the checked `seqs` as micro-batches into the logits the session was
    /// started for.
    fn eval_entries(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], RingError> {
        let tokens = seqs.iter().map(|s| s.tokens.len()).sum();
        let m = match self.micro_batches {
            Some(m) => m,
            None => self.tuner.choose(seqs.len(), tokens),
        };
        let groups = micro_batch_groups(seqs, m);
        let started = Instant::now();
        self.ring.micro_batches(&mut self.session, seqs, &groups)?;
        if self.micro_batches.is_none() {
            let seconds = started.elapsed().as_secs_f64();
            self.tuner.record(seqs.len(), tokens, groups.len(), seconds);
        }
        Ok(self.session.entry_logits())
    }
}

/// The last pass brings every row's hidden state back to the head (unless the output
/// device was told to send only logits: `OutputSetup::hidden`), so any row's logits are
/// computed here.
impl RowLogits for RingHead<'_> {
    fn n_batch(&self) -> usize {
        self.session.n_batch()
    }

    fn row_logits(
        &mut self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), RingError> {
        if self.ring.remote_output.is_some_and(|o| !o.hidden) {
            return Err(RingError::Plan(
                "rows' logits after the fact need the hidden states back from the output device (RingOptions::output.hidden)".into(),
            ));
        }
        Ok(self.session.logits_rows(rows, out)?)
    }
}

impl Drop for RingHead<'_> {
    fn drop(&mut self) {
        if self.health.is_some() {
            self.stop(false);
        }
    }
}

/// Receives the last device's frames into `arrived` until the connection closes (the
/// head stopping, or the health thread's verdict). A thread of its own, so the last
/// device can always hand its frame on even while the head is busy sending another
/// micro-batch to device 1: otherwise two frames bigger than the links' buffers could
/// leave every device of the ring waiting for the next one to read.
fn read_loop(shared: &Shared, arrived: &mpsc::Sender<Result<Vec<u8>, RingError>>) {
    loop {
        match recv_frame(&shared.data_in, NO_TIMEOUT) {
            Ok(Some(frame)) => {
                if arrived.send(Ok(frame)).is_err() {
                    return;
                }
            }
            Ok(None) => {}
            Err(e) => {
                let _ = arrived.send(Err(e));
                return;
            }
        }
    }
}

/// Pings every node until stopped; on trouble, sweeps all nodes once more and records who
/// is at fault: a node that is gone or silent before one that reports a broken link.
fn health_loop(shared: &Shared) {
    let mut seq = 0u64;
    while !shared.stop.load(Ordering::Acquire) {
        let mut symptoms = Vec::new();
        let mut culprit = None;
        for link in &shared.nodes {
            if shared.stop.load(Ordering::Acquire) {
                return;
            }
            seq += 1;
            let verdict = |reason: String| Verdict {
                device: link.device,
                addr: link.addr.clone(),
                reason,
            };
            let ping = Control::Ping {
                seq,
                pad: String::new(),
            };
            match link.ask(&ping, PONG_TIMEOUT_MS) {
                Ok(Some(Control::Pong { .. })) => {}
                Ok(Some(Control::Refused { reason })) => symptoms.push(verdict(reason)),
                Ok(Some(other)) => {
                    symptoms.push(verdict(format!("answered a ping with {other:?}")))
                }
                Ok(None) => {
                    culprit = Some(verdict(format!(
                        "no answer to a ping within {} s",
                        PONG_TIMEOUT_MS / 1000
                    )));
                    break;
                }
                Err(e) => {
                    culprit = Some(verdict(format!("control connection lost ({e})")));
                    break;
                }
            }
        }
        if let Some(v) = culprit.or_else(|| symptoms.into_iter().next()) {
            if !shared.stop.load(Ordering::Acquire) {
                *shared.verdict.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
                // The ring is broken: end any send or receive the head is blocked in, so
                // it reports the verdict instead of waiting on a device that is gone.
                shared.close_data();
            }
            return;
        }
        std::thread::sleep(PING_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(lens: &[usize], m: usize) -> Vec<Range<usize>> {
        let tokens: Vec<Vec<u32>> = lens.iter().map(|&n| vec![1; n]).collect();
        let seqs: Vec<SeqTokens<'_>> = tokens
            .iter()
            .enumerate()
            .map(|(slot, t)| SeqTokens { slot, tokens: t })
            .collect();
        micro_batch_groups(&seqs, m)
    }

    #[test]
    fn micro_batches_are_runs_of_entries_of_about_equal_tokens() {
        assert_eq!(groups(&[1, 1, 1, 1], 2), [0..2, 2..4]);
        assert_eq!(groups(&[1, 1, 1, 1], 3), [0..2, 2..3, 3..4]);
        assert_eq!(groups(&[1; 8], 3), [0..3, 3..6, 6..8]);
        // A long prompt chunk goes alone; the decoding rows share the rest.
        assert_eq!(groups(&[1, 128, 1, 1], 2), [0..2, 2..4]);
        assert_eq!(groups(&[128, 1, 1, 1], 3), [0..1, 1..3, 3..4]);
        // Never more groups than entries, never an empty one.
        assert_eq!(groups(&[5, 5], 3), [0..1, 1..2]);
        assert_eq!(groups(&[3], 1).len(), 1);
        assert!(groups(&[], 2).is_empty());
    }
}
