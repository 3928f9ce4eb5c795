//! The node daemon: waits for a head, takes its setup, runs its layer windows on the
//! activations that come round the ring, and goes back to waiting when the head is done.
//!
//! Threads: the main thread blocks on the data connection (it sleeps while other devices
//! compute) and computes; a control thread answers the head's pings and statistics
//! requests and ends the session on shutdown or when the head goes away.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prima_abi::backend::BackendBox;
use prima_abi::transport::{ListenerBox, TransportBox, NO_TIMEOUT};
use prima_core::batch::SeqSpan;
use prima_core::model::{GpuLayers, Model, Session};

use super::key::LinkSecurity;

use super::budget::{report_budget, ring_device_budget, MemBudget};
use super::counters::PassMeter;
use super::expert_cache::{ExpertCache, ExpertHints, PREDICT_DEFAULT};
use super::link::{
    decode_activations, expect_control, protocol_error, recv_control, recv_frame, send_control,
    send_frame,
};
use super::protocol::{
    append_logits, encode_activations_for, read_logit_rows, read_payload, read_tokens, Activations,
    Control, MemoryBaseline, ModelFingerprint, NextHop, PassStats, ProtocolError, Ready, Role,
    Setup, WireType, PROTOCOL_VERSION,
};
use super::residency::{Residency, WindowRun};
use super::run_ahead::{RunAhead, StepInput};
use super::secure::{Link, LinkListener};
use super::RingError;

/// How long setup steps wait for the other side.
const SETUP_TIMEOUT_MS: u64 = 30_000;
/// Slots a setup may ask for: far above any useful degree of batching, far below what
/// would make creating the caches a hang.
const MAX_SLOTS: usize = 1024;
/// Statistics kept between two requests (older passes are dropped).
const MAX_PASSES: usize = 1 << 16;

/// Measures this device for the head's planner (the profile's schema is the planner's).
pub type Profiler<'a> = &'a dyn Fn() -> Result<serde_json::Value, String>;

/// What a node brings to a session besides the model and backend.
pub struct NodeConfig<'a> {
    /// Bytes of weights this node may keep resident; the rest is streamed.
    /// Budget for the weights of this device's windows (`auto`: what it has available
    /// less its KV cache and buffers, read when a head sets it up).
    pub mem_budget: MemBudget,
    /// A name for this device in messages.
    pub host: String,
    /// Describes the backend in the Ready message.
    pub backend_desc: String,
    /// Answers profile requests.
    pub profiler: Profiler<'a>,
    /// How links to and from this node are protected: a peer that cannot complete the
    /// handshake is refused before any ring message is read.
    pub security: LinkSecurity,
    /// The GPU backend beside `backend`, when this node has a usable one.
    pub gpu: Option<NodeGpu<'a>>,
}

/// A node's GPU backend and how many layers of each window it runs (the paper's n_m).
#[derive(Clone, Copy)]
pub struct NodeGpu<'a> {
    pub backend: &'a BackendBox,
    /// `--gpu-layers`: n_m for every window, in place of the head's setup; `None`: what
    /// the setup says (Halda's plan).
    pub layers: Option<usize>,
}

/// The layers this node runs on its GPU: the first n_m of each window, n_m from its own
/// `--gpu-layers` or else from the setup. A setup asking for GPU layers on a node without
/// a GPU backend runs them on its backend, and says so.
fn gpu_layers(setup: &Setup, gpu: Option<&NodeGpu<'_>>, host: &str) -> Vec<usize> {
    let windows: Vec<_> = setup.windows.iter().map(|w| w.layers.clone()).collect();
    let asked = |i: usize| setup.gpu_layers.get(i).copied().unwrap_or(0);
    match gpu {
        Some(NodeGpu {
            layers: Some(n), ..
        }) => super::gpu_layers_of(&windows, |_| *n),
        Some(_) => super::gpu_layers_of(&windows, asked),
        None => {
            let n: usize = super::gpu_layers_of(&windows, asked).len();
            if n > 0 {
                eprintln!(
                    "node {host}: the plan puts {n} layers on a GPU, but this node has no usable GPU backend (--gpu-backend): they run on its own backend"
                );
            }
            Vec::new()
        }
    }
}

const RUNNING: u8 = 0;
const END_SESSION: u8 = 1;
const EXIT: u8 = 2;
const HEAD_GONE: u8 = 3;

/// Serves heads one after another on `listener` until one asks the node to exit.
pub fn serve(
    model: &Model,
    backend: &BackendBox,
    transport: &TransportBox,
    listener: ListenerBox,
    config: &NodeConfig,
) -> Result<(), RingError> {
    let fingerprint = ModelFingerprint::of(model.gguf());
    let listener = &LinkListener::start(listener, config.security.clone(), "node")?;
    loop {
        let Some(conn) = listener.accept(NO_TIMEOUT) else {
            continue;
        };
        match recv_control(&conn, 5_000) {
            Ok(Some(Control::Hello {
                role: Role::Control,
                protocol,
            })) if protocol != PROTOCOL_VERSION => {
                // Said now: a newer head's setup may hold fields this node cannot parse.
                let reason = protocol_mismatch(protocol);
                tracing::warn!(peer = %conn.peer(), "{reason}; closing");
                let _ = send_control(&conn, &Control::Refused { reason });
                conn.close();
                continue;
            }
            Ok(Some(Control::Hello {
                role: Role::Control,
                ..
            })) => {}
            Ok(other) => {
                tracing::warn!(peer = %conn.peer(), "expected a head's hello, got {other:?}; closing");
                continue;
            }
            Err(e) => {
                tracing::warn!("{e}");
                continue;
            }
        }
        let head = conn.peer().into_string();
        // A head times its link to this node with pings before it asks for more.
        let mut next = expect_control(&conn, SETUP_TIMEOUT_MS, "a setup or a profile request");
        while let Ok(Control::Ping { seq, pad }) = next {
            next = send_control(&conn, &Control::Pong { seq, pad }).and_then(|()| {
                expect_control(&conn, SETUP_TIMEOUT_MS, "a setup or a profile request")
            });
        }
        let first = match next {
            Ok(Control::ProfileRequest) => {
                let reply = match (config.profiler)() {
                    Ok(profile) => Control::Profile { profile },
                    Err(reason) => Control::Refused { reason },
                };
                let _ = send_control(&conn, &reply);
                conn.close();
                continue;
            }
            Ok(Control::Setup(setup)) => *setup,
            Ok(other) => {
                tracing::warn!(peer = %head, "expected a setup, got {other:?}; closing");
                conn.close();
                continue;
            }
            Err(e) => {
                tracing::warn!("{e}");
                conn.close();
                continue;
            }
        };
        eprintln!("node: head {head} connected");
        let node = Node {
            model,
            backend,
            transport,
            listener,
            config,
            fingerprint: &fingerprint,
        };
        match session(&node, first, &conn) {
            Ok(true) => {
                eprintln!("node: head {head} asked this node to exit");
                return Ok(());
            }
            Ok(false) => eprintln!("node: session with {head} ended"),
            Err(e) => {
                eprintln!("node: session with {head} failed: {e}");
                let _ = send_control(
                    &conn,
                    &Control::Refused {
                        reason: e.to_string(),
                    },
                );
            }
        }
        conn.close();
    }
}

/// Checks a setup against this node; the reason it cannot be served otherwise.
pub fn check_setup(
    setup: &Setup,
    model: &Model,
    fingerprint: &ModelFingerprint,
) -> Result<(), String> {
    if setup.protocol != PROTOCOL_VERSION {
        return Err(protocol_mismatch(setup.protocol));
    }
    if setup.model != *fingerprint {
        return Err(format!(
            "model mismatch: this node has {} ({} bytes, header sha256 {}), the head's model has {} bytes, header sha256 {}",
            model.gguf().path().display(),
            fingerprint.file_bytes,
            &fingerprint.header_sha256[..16],
            setup.model.file_bytes,
            setup.model.header_sha256.get(..16).unwrap_or(&setup.model.header_sha256),
        ));
    }
    let n_layers = model.hparams().n_layers;
    for w in &setup.windows {
        if w.layers.start >= w.layers.end || w.layers.end > n_layers || w.round >= setup.rounds {
            return Err(format!(
                "window {:?} of round {} does not fit a {n_layers}-layer model in {} rounds",
                w.layers, w.round, setup.rounds
            ));
        }
    }
    if !setup.wire.carries_hidden_states() {
        return Err("hidden states travel as f32 or f16; token ids are a frame's kind, not a ring's wire type".into());
    }
    if setup.n_batch == 0 || setup.n_ctx == 0 || setup.n_slots == 0 {
        return Err("n_ctx, n_batch and n_slots must be positive".into());
    }
    if !setup.gpu_layers.is_empty() && setup.gpu_layers.len() != setup.windows.len() {
        return Err(format!(
            "{} GPU layer counts for {} windows",
            setup.gpu_layers.len(),
            setup.windows.len()
        ));
    }
    if let Some((w, n)) = setup
        .windows
        .iter()
        .zip(&setup.gpu_layers)
        .find(|(w, &n)| n > w.layers.len())
    {
        return Err(format!(
            "{n} GPU layers asked for window {:?}, longer than the window",
            w.layers
        ));
    }
    if setup.n_slots > MAX_SLOTS {
        return Err(format!(
            "{} slots asked, this node keeps at most {MAX_SLOTS}",
            setup.n_slots
        ));
    }
    Ok(())
}

fn protocol_mismatch(head: u32) -> String {
    format!("the head speaks ring protocol v{head}, this node speaks v{PROTOCOL_VERSION}")
}

/// One head's session. `Ok(true)` when the head asked the node to exit.
/// What a session runs with: this node's model, backend, transport and configuration.
struct Node<'a> {
    model: &'a Model,
    backend: &'a BackendBox,
    transport: &'a TransportBox,
    listener: &'a LinkListener,
    config: &'a NodeConfig<'a>,
    fingerprint: &'a ModelFingerprint,
}

fn session(node: &Node<'_>, setup: Setup, control: &Link) -> Result<bool, RingError> {
    let Node {
        model,
        backend,
        transport,
        listener,
        config,
        fingerprint,
    } = *node;
    let peer = control.peer().into_string();
    check_setup(&setup, model, fingerprint).map_err(RingError::Setup)?;
    let memory = MemoryBaseline::now();
    let held: Vec<usize> = setup
        .windows
        .iter()
        .flat_map(|w| w.layers.clone())
        .collect();
    let on_gpu = gpu_layers(&setup, config.gpu.as_ref(), &config.host);
    // This node runs the output layer for the head: it keeps the output head as the head
    // would (out of its layers' budget, read before the first token).
    let runs_output = setup.output.is_some()
        && held
            .last()
            .is_some_and(|&il| il + 1 == model.hparams().n_layers);
    let mut session = Session::with_split(
        model,
        backend,
        config.gpu.map(|g| GpuLayers {
            backend: g.backend,
            layers: &on_gpu,
        }),
        setup.n_ctx,
        setup.n_batch,
        setup.n_slots,
        &held,
    )?;
    // The GPU layers' keys and values live in VRAM, not in this budget.
    let budget = ring_device_budget(
        config.mem_budget,
        model,
        held.len() - on_gpu.len(),
        runs_output,
        setup.n_ctx,
        setup.n_batch,
        setup.n_slots,
    );
    // A mixture of experts keeps its layers' shared parts and its hottest experts and
    // streams the other experts per use, when the shared parts fit; else whole layers.
    let cpu_held: Vec<usize> = held
        .iter()
        .copied()
        .filter(|il| !on_gpu.contains(il))
        .collect();
    let experts = budget.as_ref().and_then(|b| {
        let hints = ExpertHints {
            prefetch: setup.prefetch,
            release: setup.release,
            method: setup.release_method,
            predict: PREDICT_DEFAULT,
            persist: true,
        };
        ExpertCache::plan_layers(model, &cpu_held, b.bytes, None, hints).map(Arc::new)
    });
    let mut residency = Residency::plan_split(
        model,
        &setup.windows,
        &on_gpu,
        budget
            .as_ref()
            .filter(|_| experts.is_none())
            .map(|b| b.bytes),
        setup.prefetch,
        setup.release,
        setup.release_method,
    );
    if runs_output {
        residency.keep_output_head(model);
    }
    report_budget("node", budget.as_ref(), &residency);
    match (&experts, &budget) {
        (Some(cache), Some(b)) => {
            eprintln!("node: memory: {b}; {}", cache.describe());
            cache.warm();
            session.set_expert_policy(Some(cache.clone()));
        }
        _ => residency.warm(model),
    }

    let next_addr = match &setup.next {
        NextHop::Node { addr } => addr.clone(),
        NextHop::Head { port } => {
            let ip = peer
                .parse::<std::net::SocketAddr>()
                .map(|a| a.ip().to_string())
                .map_err(|_| {
                    RingError::Setup(format!("cannot tell the head's address from {peer}"))
                })?;
            if ip.contains(':') {
                format!("[{ip}]:{port}")
            } else {
                format!("{ip}:{port}")
            }
        }
    };
    let data_out = Link::connect(transport, &next_addr, SETUP_TIMEOUT_MS, &config.security)?;
    send_control(
        &data_out,
        &Control::Hello {
            protocol: PROTOCOL_VERSION,
            role: Role::Data,
        },
    )?;
    let data_in = accept_data(listener)?;
    send_control(
        control,
        &Control::Ready(Ready {
            host: config.host.clone(),
            backend: config.backend_desc.clone(),
            layers: held.len(),
            resident_windows: residency.resident_count(),
            streamed_windows: residency.streamed_count(),
            streamed_bytes: residency.streamed_bytes(),
            mem_budget: budget.as_ref().map(|b| b.bytes),
        }),
    )?;

    let state = AtomicU8::new(RUNNING);
    let failure = Mutex::new(None::<String>);
    let passes = Mutex::new(Vec::<PassStats>::new());
    std::thread::scope(|scope| {
        let control_thread = scope.spawn(|| {
            control_loop(
                control, &data_in, &data_out, &state, &failure, &passes, memory,
            )
        });
        let result = compute_loop(
            model,
            &mut session,
            &residency,
            experts.as_deref(),
            &setup,
            &data_in,
            &data_out,
            &state,
            &passes,
        );
        if let Err(e) = &result {
            // Keep answering the head (with the reason) until it ends the session.
            eprintln!("node: {e}");
            *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
        }
        data_out.close();
        let _ = control_thread.join();
        data_in.close();
        Ok(state.load(Ordering::Acquire) == EXIT)
    })
}

/// Waits for the previous device's data connection.
fn accept_data(listener: &LinkListener) -> Result<Link, RingError> {
    let deadline = Instant::now() + std::time::Duration::from_millis(SETUP_TIMEOUT_MS);
    loop {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        if left == 0 {
            return Err(RingError::Setup(
                "the previous device in the ring did not connect within 30 s".into(),
            ));
        }
        let Some(conn) = listener.accept(left) else {
            continue;
        };
        match recv_control(&conn, 5_000) {
            Ok(Some(Control::Hello {
                role: Role::Data, ..
            })) => return Ok(conn),
            Ok(Some(Control::Hello {
                role: Role::Control,
                ..
            })) => {
                let _ = send_control(
                    &conn,
                    &Control::Refused {
                        reason: "this node is busy setting up a ring for another head".into(),
                    },
                );
                conn.close();
            }
            other => {
                tracing::warn!(peer = %conn.peer(), "unexpected first message {other:?}; closing");
                conn.close();
            }
        }
    }
}

/// Answers the head until it ends the session or goes away. Once the compute loop has
/// failed, pings are answered with its reason, so the head can tell a device that lost
/// its neighbour from the neighbour that died.
#[allow(clippy::too_many_arguments)]
fn control_loop(
    control: &Link,
    data_in: &Link,
    data_out: &Link,
    state: &AtomicU8,
    failure: &Mutex<Option<String>>,
    passes: &Mutex<Vec<PassStats>>,
    memory: MemoryBaseline,
) {
    // Closing both data connections ends whatever the compute loop is blocked in: a
    // receive, or a send to a next device that has stopped reading.
    let end = |how: u8| {
        state.store(how, Ordering::Release);
        data_in.close();
        data_out.close();
    };
    loop {
        let reply = match recv_control(control, NO_TIMEOUT) {
            Ok(None) => continue,
            Ok(Some(Control::Ping { seq, pad })) => {
                match failure.lock().unwrap_or_else(|e| e.into_inner()).clone() {
                    Some(reason) => Control::Refused { reason },
                    None => Control::Pong { seq, pad },
                }
            }
            Ok(Some(Control::StatsRequest)) => {
                let taken = std::mem::take(&mut *passes.lock().unwrap_or_else(|e| e.into_inner()));
                Control::Stats {
                    passes: taken,
                    memory,
                }
            }
            Ok(Some(Control::Shutdown { exit })) => {
                return end(if exit { EXIT } else { END_SESSION })
            }
            Ok(Some(other)) => {
                tracing::warn!("unexpected control message {other:?}");
                continue;
            }
            Err(_) => return end(HEAD_GONE),
        };
        if send_control(control, &reply).is_err() {
            return end(HEAD_GONE);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn compute_loop(
    model: &Model,
    session: &mut Session<'_>,
    residency: &Residency,
    experts: Option<&ExpertCache<'_>>,
    setup: &Setup,
    data_in: &Link,
    data_out: &Link,
    state: &AtomicU8,
    passes: &Mutex<Vec<PassStats>>,
) -> Result<(), RingError> {
    let (n_embd, n_vocab) = (model.hparams().n_embd, model.hparams().n_vocab);
    let peer = data_in.peer().into_string();
    // The round in which this node runs the model's last layer, when it also runs the
    // output layer for the head.
    let output_round = setup.output.and_then(|o| {
        let n_layers = model.hparams().n_layers;
        setup
            .windows
            .iter()
            .find(|w| w.layers.end == n_layers)
            .map(|w| (w.round, o.top_k))
    });
    // Computing the whole model alone for a head that only embeds and samples: run
    // ahead while the head samples (`run_ahead.rs`).
    let whole_model = setup.rounds == 1
        && setup.windows.len() == 1
        && setup.windows[0].layers == (0..model.hparams().n_layers);
    let mut ahead = (whole_model && output_round.is_some()).then(RunAhead::default);
    // Token ids come only into round 0, and only where this node's round-0 window, if
    // it has one, starts at the first layer (the head ran none).
    let takes_tokens = setup
        .windows
        .iter()
        .filter(|w| w.round == 0)
        .all(|w| w.layers.start == 0);
    let mut tokens = Vec::new();
    let mut input = Vec::new();
    let mut out = Vec::new();
    let mut spans = Vec::new();
    let mut logit_rows = Vec::new();
    let mut logits = Vec::new();
    let mut meter = PassMeter::new();
    let mut flying = InFlight::default();
    loop {
        let waiting = Instant::now();
        let frame = match recv_frame(data_in, NO_TIMEOUT) {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(_) if state.load(Ordering::Acquire) != RUNNING => {
                if let Some(a) = ahead.as_ref().filter(|a| a.computed > 0) {
                    eprintln!(
                        "node: computed {} steps ahead of the head, {} of them taken",
                        a.computed, a.taken
                    );
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let wait_ms = waiting.elapsed().as_secs_f64() * 1e3;
        let (header, table, payload) = decode_activations(&frame, &peer)?;
        let round = header.round as usize;
        let n = header.n_tokens as usize;
        table.read_into(&mut spans);
        flying
            .arrive(header.seq, round, &spans, setup.n_slots)
            .map_err(|why| RingError::Unexpected {
                peer: peer.clone(),
                expected: "the next round of a batch in flight, or a new batch",
                got: format!(
                    "batch {} round {round} with spans {spans:?}: {why}",
                    header.seq
                ),
            })?;
        read_logit_rows(&header, payload, &mut logit_rows).map_err(protocol_error(&peer))?;
        let tokens_in = header.wire == WireType::Tokens;
        if tokens_in {
            if round != 0 || !takes_tokens {
                return Err(protocol_error(&peer)(ProtocolError::TokensUnexpected));
            }
            read_tokens(&header, payload, n_vocab, &mut tokens).map_err(protocol_error(&peer))?;
        }
        // The step computed ahead, when this is it (its cache entries are in place).
        let guessed = match ahead.as_mut().filter(|a| a.has_guess()) {
            Some(a) => {
                let step = if tokens_in {
                    StepInput::Tokens(&tokens)
                } else {
                    input.resize(n * n_embd, 0.0);
                    read_payload(&header, payload, n_embd, &mut input)
                        .map_err(protocol_error(&peer))?;
                    StepInput::Hidden(&input)
                };
                a.take_if_guessed(&spans, &logit_rows, step)
                    .and_then(|g| g.output)
            }
            None => None,
        };
        // Logits already computed upstream (this node only relays the last frames).
        let mut passed_logits: &[u8] = &[];
        if guessed.is_none() {
            // Round 0: each slot forgets its positions from its span's start on. A later
            // round: the batch's positions were cut then, so this only sets the rows'
            // positions and spans again (another batch may have run in between).
            session.begin_spans(&spans)?;
            if tokens_in {
                session.embed(&tokens)?;
            } else {
                passed_logits = read_payload(&header, payload, n_embd, session.hidden_mut())
                    .map_err(protocol_error(&peer))?;
            }
        }

        let experts_before = experts.map(ExpertCache::stats).unwrap_or_default();
        let mut run = match &guessed {
            Some(g) => WindowRun {
                index: None,
                compute_ms: g.compute_ms,
                major_faults: 0,
            },
            None => residency.run_round(model, session, &meter, round)?,
        };
        let top_k = match output_round {
            Some((r, top_k)) if r == round && !logit_rows.is_empty() => {
                if guessed.is_none() {
                    let computing = Instant::now();
                    session.logits_of(&logit_rows, &mut logits)?;
                    run.compute_ms += computing.elapsed().as_secs_f64() * 1e3;
                }
                Some(top_k)
            }
            _ => None,
        };
        let experts_after = experts.map(ExpertCache::stats).unwrap_or_default();

        // Counters before the send, as on the head (`RingHead::pass`): after it, this
        // thread should only hint pages and go back to sleep.
        let (disk_read_bytes, mem_available) = meter.end_pass();
        // The pass is logged before its frame leaves: once the frame is on its way the
        // head may finish the token and ask for the statistics before this thread runs
        // again. Its send time is filled in after the send.
        let pass = PassStats {
            seq: header.seq,
            round,
            n_tokens: n,
            wait_ms,
            compute_ms: run.compute_ms,
            send_ms: 0.0,
            major_faults: run.major_faults,
            disk_read_bytes,
            mem_available,
            expert_hits: experts_after.hits - experts_before.hits,
            expert_misses: experts_after.misses - experts_before.misses,
            expert_streamed_bytes: experts_after.streamed_bytes - experts_before.streamed_bytes,
        };
        let logged = {
            let mut log = passes.lock().unwrap_or_else(|e| e.into_inner());
            (log.len() < MAX_PASSES).then(|| {
                log.push(pass);
                log.len() - 1
            })
        };
        let sending = Instant::now();
        // What this node sends on: hidden states in the ring's wire type, or after the
        // output layer only the logits when the head wants no more.
        let last_round = round + 1 == setup.rounds;
        let out_wire = match setup.output {
            Some(o) if top_k.is_some() && last_round && !o.hidden => WireType::LogitsOnly,
            _ if tokens_in => setup.wire,
            _ => header.wire,
        };
        let out_header = Activations {
            wire: out_wire,
            ..header
        };
        let (sent_spans, hidden) = match &guessed {
            Some(g) => (&spans[..], &g.hidden[..]),
            None => session.outgoing()?,
        };
        encode_activations_for(&mut out, &out_header, sent_spans, &logit_rows, hidden);
        let sent_logits = guessed.as_ref().map_or(&logits, |g| &g.logits);
        match top_k {
            Some(top_k) => append_logits(&mut out, top_k, n_vocab, sent_logits),
            None => out.extend_from_slice(passed_logits),
        }
        send_frame(data_out, &out)?;
        let send_ms = sending.elapsed().as_secs_f64() * 1e3;
        if let Some(at) = logged {
            let mut log = passes.lock().unwrap_or_else(|e| e.into_inner());
            // Unless the head took the log in between.
            if let Some(p) = log
                .get_mut(at)
                .filter(|p| p.seq == header.seq && p.round == round)
            {
                p.send_ms = send_ms;
            }
        }
        if let Some(i) = run.index {
            residency.after_window(model, i);
        }
        if round + 1 == setup.rounds {
            // A step computed ahead was finished then.
            if guessed.is_none() {
                session.finish_batch();
            }
            flying.land(header.seq);
        }
        if let (Some(a), Some(_)) = (ahead.as_mut(), top_k) {
            if flying.is_empty() {
                let sent_logits = guessed.as_ref().map_or(&logits, |g| &g.logits);
                a.guess(
                    model,
                    session,
                    residency,
                    &meter,
                    &spans,
                    &logit_rows,
                    sent_logits,
                )?;
            }
        }
    }
}

/// The batches (micro-batches) in the ring that have passed this node for some rounds
/// but not their last: frames of several may come in any interleaving, but each batch's
/// rounds in order, with the spans it started with. No slot is in two of them (their
/// rows would write the same cache positions).
#[derive(Default)]
struct InFlight {
    /// Each batch's number, next round and spans.
    batches: Vec<(u64, usize, Vec<SeqSpan>)>,
}

impl InFlight {
    /// Checks and records that round `round` of batch `seq` with `spans` has come; the
    /// reason it is out of order otherwise.
    fn arrive(
        &mut self,
        seq: u64,
        round: usize,
        spans: &[SeqSpan],
        n_slots: usize,
    ) -> Result<(), String> {
        match self.batches.iter_mut().find(|b| b.0 == seq) {
            Some(b) if b.1 != round => Err(format!("round {} of this batch was next", b.1)),
            Some(b) if b.2 != spans => Err(format!("the batch started with spans {:?}", b.2)),
            Some(b) => {
                b.1 += 1;
                Ok(())
            }
            None if round != 0 => Err("no such batch in flight".into()),
            None => {
                // The head starts a slot's batch only once the slot's last one is back:
                // a batch that holds one of these slots was given up (an evaluation that
                // failed half way), and its rounds never come.
                self.batches
                    .retain(|b| !b.2.iter().any(|o| spans.iter().any(|s| s.slot == o.slot)));
                // Each batch holds slots of its own: never more batches than slots.
                if self.batches.len() >= n_slots {
                    return Err(format!("already {} batches in flight", self.batches.len()));
                }
                self.batches.push((seq, 1, spans.to_vec()));
                Ok(())
            }
        }
    }

    /// Batch `seq` has had its last round here.
    fn land(&mut self, seq: u64) {
        self.batches.retain(|b| b.0 != seq);
    }

    fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(slots: &[usize]) -> Vec<SeqSpan> {
        slots
            .iter()
            .map(|&slot| SeqSpan {
                slot,
                start: 4,
                len: 1,
            })
            .collect()
    }

    #[test]
    fn batches_interleave_but_each_keeps_its_rounds_and_spans() {
        let mut f = InFlight::default();
        let (a, b) = (spans(&[0, 1]), spans(&[2]));
        f.arrive(7, 0, &a, 4).unwrap();
        f.arrive(8, 0, &b, 4).unwrap();
        f.arrive(7, 1, &a, 4).unwrap();
        assert!(f.arrive(7, 1, &a, 4).unwrap_err().contains("round 2"));
        assert!(f.arrive(8, 1, &a, 4).unwrap_err().contains("started with"));
        assert!(f.arrive(9, 1, &b, 4).unwrap_err().contains("no such batch"));
        f.arrive(8, 1, &b, 4).unwrap();
        f.land(7);
        f.land(8);
        assert!(f.batches.is_empty());
    }

    #[test]
    fn a_slots_new_batch_supersedes_one_given_up() {
        let mut f = InFlight::default();
        f.arrive(1, 0, &spans(&[0, 1]), 2).unwrap();
        // The head gave batch 1 up; its slot 1 starts again in batch 2.
        f.arrive(2, 0, &spans(&[1]), 2).unwrap();
        assert!(f.arrive(1, 1, &spans(&[0, 1]), 2).is_err());
        // No more batches than slots (a batch of an empty span holds none).
        let empty = [SeqSpan {
            slot: 0,
            start: 0,
            len: 0,
        }];
        f.arrive(3, 0, &empty, 2).unwrap();
        assert!(f
            .arrive(4, 0, &spans(&[]), 2)
            .unwrap_err()
            .contains("already 2"));
    }
}
