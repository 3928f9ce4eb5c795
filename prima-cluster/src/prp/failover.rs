//! A ring that outlives its devices. [`ResilientRing`] is a [`Forward`] over a
//! [`RingHead`]: when the head's health verdict names a lost device
//! ([`RingError::DeviceLost`]), it plans the ring again without that device (the caller's
//! [`Replan`], e.g. Halda over the profiles `prima apply` collected), connects the new
//! ring, rebuilds the KV cache by evaluating the context's tokens again, and retries the
//! evaluation that failed. The caller sees one slow `eval` and the same logits; a sampler
//! outside (its RNG state) never notices, so a greedy generation ends with the tokens an
//! undisturbed run gives and a sampled one goes on from the same state.
//!
//! The context is replayed in one evaluation (batches of `n_batch`), not call by call:
//! a batch computes every row as the same row evaluated alone would (`tests/failover.rs`
//! checks the logits bit for bit), so the cheapest replay is also an exact one. With
//! several slots ([`BatchForward`]) every slot's context is replayed in that one
//! evaluation, beside the entries that were asked for.
//!
//! Between requests, [`ResilientRing::readmit`] asks each lost device whether it answers
//! again (its node restarted at the same address) and, if one does, plans it back in.
//!
//! Not here: how a ring is planned (the [`Replan`] callback), or keeping the caches of
//! layers that did not move: every device gets a new setup, so every cache is rebuilt.

use std::time::{Duration, Instant};

use prima_abi::backend::BackendBox;
use prima_abi::transport::TransportBox;
use prima_core::batch::{check_entries, check_rows, BatchForward, BatchRowLogits, SeqTokens};
use prima_core::generate::{Forward, RowLogits};
use prima_core::model::{Model, ModelError, Session};

use super::head::{request_profile, DeviceStats, NextRoute, RingHead, RingOptions};
use super::RingError;

/// How long a lost device has to answer a probe: a profile request, which a node that
/// is up and free answers from its cache (the first one measures; the probe after that
/// gets the answer). A frozen node accepts the connection and never answers.
const PROBE_TIMEOUT_MS: u64 = 5_000;
/// A lost device is probed at most this often; after a probe that waited out its
/// timeout (a frozen node) the interval doubles, up to [`PROBE_EVERY_MAX`], so a device
/// that stays frozen costs the requests little.
const PROBE_EVERY: Duration = Duration::from_secs(2);
const PROBE_EVERY_MAX: Duration = Duration::from_secs(80);

/// One device of a ring layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingDevice {
    /// Its name, as the manifest calls it.
    pub name: String,
    /// Where the head reaches it (unused for the head itself).
    pub addr: String,
}

/// A ring to connect: what [`RingHead::connect`] takes, with the devices' names.
#[derive(Debug, Clone)]
pub struct RingLayout {
    /// The ring's devices in ring order, the head first.
    pub devices: Vec<RingDevice>,
    /// Each device's window size w_m, the head's first.
    pub windows: Vec<usize>,
    /// How each node reaches the device after it ([`RingOptions::next_routes`]).
    pub next_routes: Vec<NextRoute>,
    /// The device that runs the last layer runs the output layer too
    /// ([`RingOptions::output`]).
    pub output_on_last: bool,
    /// Devices planned out because they did not answer: not in the ring, asked between
    /// requests whether they answer now, like devices lost later.
    pub absent: Vec<RingDevice>,
}

/// Plans the ring over every device but those named; `Err`: why the devices left cannot
/// hold the model. It may print the plan.
pub type Replan<'a> = Box<dyn FnMut(&[String]) -> Result<RingLayout, String> + 'a>;

/// Why the ring was planned again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplanCause {
    /// A device was lost.
    DeviceLost,
    /// A lost device answers again.
    DeviceBack,
}

impl ReplanCause {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplanCause::DeviceLost => "device_lost",
            ReplanCause::DeviceBack => "device_back",
        }
    }
}

/// What happened to the ring since it was last asked ([`ResilientRing::take_events`]).
#[derive(Debug, Clone, PartialEq)]
pub enum FailoverEvent {
    /// The ring was planned and connected again, now of `devices` devices.
    Replanned { cause: ReplanCause, devices: usize },
    /// No ring could be planned over the devices left.
    NoPlan,
    /// The first logits after a loss came this long after the loss was reported.
    Recovered { after: Duration },
    /// A device was found gone (mid-request, or when it did not join a new ring).
    Lost { device: String, reason: String },
    /// A lost device answers again (it is planned back in next).
    Back { device: String },
}

/// A lost device, when it was last asked whether it is back, and when to ask again.
#[derive(Debug, Clone)]
struct Lost {
    device: RingDevice,
    probed: Instant,
    every: Duration,
}

/// What runs the layers now.
enum Inner<'m> {
    /// Nothing: the ring broke and no new one is connected yet.
    Down,
    Ring(Box<RingHead<'m>>),
    /// The plan left the head alone.
    Alone(Box<Session<'m>>),
}

/// A [`Forward`] over a ring that plans itself again when a device is lost.
pub struct ResilientRing<'m> {
    model: &'m Model,
    backend: &'m BackendBox,
    transport: &'m TransportBox,
    options: RingOptions,
    replan: Replan<'m>,
    layout: RingLayout,
    inner: Inner<'m>,
    /// The tokens of each slot's context, in order: what the inner cache holds, or
    /// (after a new ring was connected) must hold again before the next evaluation.
    /// Slot 0's is the context of [`Forward`].
    contexts: Vec<Vec<u32>>,
    /// Per slot, the context's missing tail and the tokens to evaluate, when a new ring
    /// catches up.
    replay: Vec<Vec<u32>>,
    /// The last logits (the inner `Forward`'s are gone once it is replaced).
    logits: Vec<f32>,
    /// Row r of the last evaluation's tokens is row r + this of the inner's last batch
    /// (a replay went before them; negative: they began in an earlier batch).
    row_shift: isize,
    lost: Vec<Lost>,
    events: Vec<FailoverEvent>,
    /// Told each event as it happens ([`ResilientRing::observe`]).
    observer: Option<Observer<'m>>,
}

/// What [`ResilientRing::observe`] takes.
pub type Observer<'m> = Box<dyn FnMut(&FailoverEvent) + Send + 'm>;

impl<'m> ResilientRing<'m> {
    /// Takes over `head`, connected as `layout` with `options`; `replan` plans the ring
    /// again when a device is lost or comes back.
    pub fn new(
        head: RingHead<'m>,
        model: &'m Model,
        backend: &'m BackendBox,
        transport: &'m TransportBox,
        layout: RingLayout,
        options: RingOptions,
        replan: Replan<'m>,
    ) -> ResilientRing<'m> {
        let mut ring = ResilientRing::down(model, backend, transport, layout, options, replan);
        ring.inner = Inner::Ring(Box::new(head));
        ring
    }

    /// A ring whose first connection could not be made as `layout` says: plans and
    /// connects one over the devices that answer, `layout.absent` (and any that fails to
    /// join) left out and asked between requests whether they answer, as lost devices
    /// are. The ring may be the head alone.
    pub fn connecting(
        model: &'m Model,
        backend: &'m BackendBox,
        transport: &'m TransportBox,
        layout: RingLayout,
        options: RingOptions,
        replan: Replan<'m>,
    ) -> Result<ResilientRing<'m>, RingError> {
        let mut ring = ResilientRing::down(model, backend, transport, layout, options, replan);
        ring.reconnect(ReplanCause::DeviceLost)?;
        Ok(ring)
    }

    fn down(
        model: &'m Model,
        backend: &'m BackendBox,
        transport: &'m TransportBox,
        layout: RingLayout,
        options: RingOptions,
        replan: Replan<'m>,
    ) -> ResilientRing<'m> {
        let n_slots = options.n_slots.max(1);
        let absent = layout.absent.clone();
        let mut ring = ResilientRing {
            model,
            backend,
            transport,
            options,
            replan,
            inner: Inner::Down,
            contexts: vec![Vec::new(); n_slots],
            replay: vec![Vec::new(); n_slots],
            logits: Vec::new(),
            row_shift: 0,
            lost: Vec::new(),
            events: Vec::new(),
            observer: None,
            layout,
        };
        for device in absent {
            ring.mark_lost(device, "did not answer when the ring was planned");
        }
        ring
    }

    /// The ring's devices now, the head first (none when it is down).
    pub fn devices(&self) -> &[RingDevice] {
        match self.inner {
            Inner::Down => &[],
            _ => &self.layout.devices,
        }
    }

    /// Each device's window size w_m now, as [`ResilientRing::devices`] (none when down).
    pub fn windows(&self) -> &[usize] {
        match self.inner {
            Inner::Down => &[],
            _ => &self.layout.windows,
        }
    }

    /// The nodes of the ring now, as they reported when they joined (none when the ring
    /// is down or the head alone).
    pub fn nodes(&self) -> &[super::head::NodeInfo] {
        match &self.inner {
            Inner::Ring(head) => head.nodes(),
            _ => &[],
        }
    }

    /// The devices lost and not back.
    pub fn lost(&self) -> impl Iterator<Item = &RingDevice> {
        self.lost.iter().map(|l| &l.device)
    }

    /// Rounds per token (k) of the ring now.
    pub fn rounds(&self) -> usize {
        match &self.inner {
            Inner::Ring(head) => head.rounds(),
            _ => 1,
        }
    }

    /// Collects (and clears) every device's per-pass statistics, as
    /// [`RingHead::collect_stats`]; none when the ring is down or the head alone.
    pub fn collect_stats(&mut self) -> Result<Vec<DeviceStats>, RingError> {
        match &mut self.inner {
            Inner::Ring(head) => head.collect_stats(),
            _ => Ok(Vec::new()),
        }
    }

    /// What happened since the last call.
    pub fn take_events(&mut self) -> Vec<FailoverEvent> {
        std::mem::take(&mut self.events)
    }

    /// Calls `observer` with each event as it happens (in the middle of an evaluation, for
    /// a loss), beside keeping it for [`ResilientRing::take_events`]; replaces any before.
    pub fn observe(&mut self, observer: Observer<'m>) {
        self.observer = Some(observer);
    }

    fn record(&mut self, event: FailoverEvent) {
        if let Some(observer) = &mut self.observer {
            observer(&event);
        }
        self.events.push(event);
    }

    /// Ends the session on every node, as [`RingHead::shutdown`].
    pub fn shutdown(self, exit: bool) {
        if let Inner::Ring(head) = self.inner {
            (*head).shutdown(exit);
        }
    }

    /// Asks every lost device not asked within [`PROBE_EVERY`] whether it answers again;
    /// if one does, plans the ring again with it and connects that ring (the context is
    /// replayed at the next evaluation). True when the ring was planned again.
    pub fn readmit(&mut self) -> Result<bool, RingError> {
        let now = Instant::now();
        let mut back = Vec::new();
        for lost in &mut self.lost {
            if now - lost.probed < lost.every {
                continue;
            }
            let asked = Instant::now();
            if request_profile(
                self.transport,
                &lost.device.addr,
                PROBE_TIMEOUT_MS,
                &self.options.security,
            )
            .is_ok()
            {
                back.push(lost.device.name.clone());
            } else if asked.elapsed() >= Duration::from_millis(PROBE_TIMEOUT_MS) {
                lost.every = (lost.every * 2).min(PROBE_EVERY_MAX);
            }
            lost.probed = Instant::now();
        }
        if back.is_empty() {
            return Ok(false);
        }
        for name in &back {
            eprintln!("failover: device '{name}' answers again; planning the ring with it");
            self.record(FailoverEvent::Back {
                device: name.clone(),
            });
        }
        self.lost.retain(|l| !back.contains(&l.device.name));
        self.reconnect(ReplanCause::DeviceBack)?;
        Ok(true)
    }

    /// Plans and connects a new ring over the devices not lost, marking lost any that
    /// fails to join. The new ring's cache is empty.
    fn reconnect(&mut self, cause: ReplanCause) -> Result<(), RingError> {
        // The old ring first: its nodes end their sessions and wait for a head again.
        self.inner = Inner::Down;
        loop {
            let excluded: Vec<String> = self.lost.iter().map(|l| l.device.name.clone()).collect();
            let layout = match (self.replan)(&excluded) {
                Ok(layout) => layout,
                Err(reason) => {
                    self.record(FailoverEvent::NoPlan);
                    return Err(RingError::NoPlan {
                        lost: name_list(&excluded),
                        reason,
                    });
                }
            };
            for device in layout.absent.clone() {
                self.mark_lost(device, "did not answer when the ring was planned");
            }
            match self.connect(&layout) {
                Ok(inner) => {
                    eprintln!(
                        "failover: ring of {} connected ({})",
                        layout.devices.len(),
                        describe(&layout)
                    );
                    self.record(FailoverEvent::Replanned {
                        cause,
                        devices: layout.devices.len(),
                    });
                    self.inner = inner;
                    self.layout = layout;
                    return Ok(());
                }
                Err(RingError::DeviceLost {
                    device,
                    addr,
                    reason,
                })
                | Err(RingError::Refused {
                    device,
                    addr,
                    reason,
                }) if device > 0 && device < layout.devices.len() => {
                    let lost = layout.devices[device].clone();
                    eprintln!(
                        "failover: device '{}' ({addr}) did not join the new ring: {reason}",
                        lost.name
                    );
                    if !self.mark_lost(lost, &reason) {
                        return Err(RingError::DeviceLost {
                            device,
                            addr,
                            reason,
                        });
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn connect(&self, layout: &RingLayout) -> Result<Inner<'m>, RingError> {
        if layout.devices.len() <= 1 {
            let session = Session::with_slots(
                self.model,
                self.backend,
                self.options.n_ctx,
                self.options.n_batch,
                self.options.n_slots,
            )?;
            return Ok(Inner::Alone(Box::new(session)));
        }
        let nodes: Vec<String> = layout.devices[1..].iter().map(|d| d.addr.clone()).collect();
        let options = RingOptions {
            next_routes: layout.next_routes.clone(),
            output: self.options.output.filter(|_| layout.output_on_last),
            ..self.options.clone()
        };
        let head = RingHead::connect(
            self.model,
            self.backend,
            self.transport,
            &nodes,
            &layout.windows,
            &options,
        )?;
        Ok(Inner::Ring(Box::new(head)))
    }

    /// Records `device` as lost; false when it already was (a plan that still holds it,
    /// which trying again would not change).
    fn mark_lost(&mut self, device: RingDevice, reason: &str) -> bool {
        if self.lost.iter().any(|l| l.device.name == device.name) {
            return false;
        }
        self.record(FailoverEvent::Lost {
            device: device.name.clone(),
            reason: reason.to_string(),
        });
        self.lost.push(Lost {
            device,
            probed: Instant::now(),
            every: PROBE_EVERY,
        });
        true
    }

    /// Evaluates `tokens` on the ring as it is; on a lost device, `Err` with that device.
    /// A ring that lacks part of the context (a new one) evaluates it first, in the same
    /// call.
    fn try_eval(&mut self, tokens: &[u32]) -> Result<(), RingError> {
        let ResilientRing {
            inner,
            contexts,
            replay,
            logits,
            row_shift,
            options,
            ..
        } = self;
        let (context, replay) = (&contexts[0], &mut replay[0]);
        let shift = |input: &[u32]| {
            let last_batch_start =
                input.len().saturating_sub(1) / options.n_batch.max(1) * options.n_batch;
            (input.len() - tokens.len()) as isize - last_batch_start as isize
        };
        let out = match inner {
            Inner::Down => return Err(RingError::Setup("the ring is down".into())),
            Inner::Ring(head) => {
                let input = catch_up(head.as_mut(), context, replay, tokens)?;
                *row_shift = shift(input);
                head.eval(input)?
            }
            Inner::Alone(session) => {
                let input = catch_up(session.as_mut(), context, replay, tokens)?;
                *row_shift = shift(input);
                session.eval(input)?
            }
        };
        logits.clear();
        logits.extend_from_slice(out);
        Ok(())
    }

    /// [`ResilientRing::try_eval`] for several slots: every slot the ring lacks part of
    /// is caught up in the same evaluation.
    fn try_eval_batch(&mut self, seqs: &[SeqTokens<'_>], rows: &[usize]) -> Result<(), RingError> {
        let ResilientRing {
            inner,
            contexts,
            replay,
            logits,
            ..
        } = self;
        match inner {
            Inner::Down => Err(RingError::Setup("the ring is down".into())),
            Inner::Ring(head) => {
                batch_catch_up(head.as_mut(), contexts, replay, seqs, rows, logits)
            }
            Inner::Alone(session) => {
                batch_catch_up(session.as_mut(), contexts, replay, seqs, rows, logits)
            }
        }
    }

    /// A lost device: marks it and takes the ring down (the next evaluation plans and
    /// connects another); `Err` when that device was already lost.
    fn lose(
        &mut self,
        device: usize,
        addr: String,
        reason: String,
        loss: &mut Option<Instant>,
    ) -> Result<(), RingError> {
        loss.get_or_insert_with(Instant::now);
        let lost = self.layout.devices[device].clone();
        eprintln!(
            "failover: device '{}' ({addr}) lost mid-request: {reason}; planning the ring without it",
            lost.name
        );
        self.inner = Inner::Down;
        if !self.mark_lost(lost, &reason) {
            return Err(RingError::DeviceLost {
                device,
                addr,
                reason,
            });
        }
        Ok(())
    }

    /// Reports the recovery after a loss, `replayed` context tokens later.
    fn recovered(&mut self, loss: Option<Instant>, replayed: usize) {
        if let Some(t) = loss {
            let after = t.elapsed();
            eprintln!(
                "failover: first logits {:.0} ms after the loss ({replayed} context tokens replayed)",
                after.as_secs_f64() * 1e3,
            );
            self.record(FailoverEvent::Recovered { after });
        }
    }
}

/// Evaluates `seqs` on `forward` after catching up every slot whose cache lacks part of
/// its context: an entry of a slot that lags is its missing tail followed by its tokens,
/// and each other slot that lags gets an entry of its missing tail, after those asked
/// for. The logits of `seqs` go to `logits`: of each entry's last token, or with `rows`
/// given, of its last `rows[i]`. A cache that holds more than its context (an
/// evaluation that failed half way) is cut first.
fn batch_catch_up<F: BatchRowLogits>(
    forward: &mut F,
    contexts: &[Vec<u32>],
    replay: &mut [Vec<u32>],
    seqs: &[SeqTokens<'_>],
    rows: &[usize],
    logits: &mut Vec<f32>,
) -> Result<(), RingError>
where
    RingError: From<F::Error>,
{
    let mut lagging = vec![false; contexts.len()];
    for (slot, context) in contexts.iter().enumerate() {
        if forward.n_past(slot) > context.len() {
            forward.truncate(slot, context.len())?;
        }
        let cached = forward.n_past(slot);
        if cached < context.len() {
            lagging[slot] = true;
            replay[slot].clear();
            replay[slot].extend_from_slice(&context[cached..]);
        }
    }
    for seq in seqs {
        if lagging[seq.slot] {
            replay[seq.slot].extend_from_slice(seq.tokens);
        }
    }
    let mut entries: Vec<SeqTokens<'_>> = seqs
        .iter()
        .map(|seq| match lagging[seq.slot] {
            true => SeqTokens {
                slot: seq.slot,
                tokens: &replay[seq.slot],
            },
            false => *seq,
        })
        .collect();
    for (slot, tail) in replay.iter().enumerate() {
        if lagging[slot] && !seqs.iter().any(|s| s.slot == slot) {
            entries.push(SeqTokens { slot, tokens: tail });
        }
    }
    let n_vocab = forward.n_vocab();
    let out = if rows.is_empty() {
        forward.eval_batch(&entries)?
    } else {
        // The lagging slots' own entries want their last row.
        let mut all = rows.to_vec();
        all.resize(entries.len(), 1);
        forward.eval_batch_rows(&entries, &all)?
    };
    let asked = if rows.is_empty() {
        seqs.len()
    } else {
        rows.iter().sum()
    };
    logits.clear();
    logits.extend_from_slice(&out[..asked * n_vocab]);
    Ok(())
}

/// What `forward` must evaluate to hold `context` and then `tokens`: `tokens` when it
/// holds the context, else the part it lacks followed by `tokens` (gathered in `replay`).
/// A cache that holds more than the context (an evaluation that failed half way) is cut.
fn catch_up<'a, F: Forward>(
    forward: &mut F,
    context: &'a [u32],
    replay: &'a mut Vec<u32>,
    tokens: &'a [u32],
) -> Result<&'a [u32], RingError>
where
    RingError: From<F::Error>,
{
    let cached = forward.n_past();
    if cached > context.len() {
        forward.truncate(context.len())?;
    }
    let cached = forward.n_past();
    if cached == context.len() {
        return Ok(tokens);
    }
    replay.clear();
    replay.extend_from_slice(&context[cached..]);
    replay.extend_from_slice(tokens);
    let replay: &'a Vec<u32> = replay;
    Ok(replay)
}

/// "device 'a'" or "devices 'a', 'b'".
fn name_list(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    match quoted.len() {
        0 => "no device".into(),
        1 => format!("device {}", quoted[0]),
        _ => format!("devices {}", quoted.join(", ")),
    }
}

/// `name w=… ` for every device of `layout`.
fn describe(layout: &RingLayout) -> String {
    layout
        .devices
        .iter()
        .zip(&layout.windows)
        .map(|(d, w)| format!("{} w={w}", d.name))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Forward for ResilientRing<'_> {
    type Error = RingError;

    fn eval(&mut self, tokens: &[u32]) -> Result<&[f32], RingError> {
        let mut loss: Option<Instant> = None;
        loop {
            if matches!(self.inner, Inner::Down) {
                self.reconnect(ReplanCause::DeviceLost)?;
            }
            match self.try_eval(tokens) {
                Ok(()) => break,
                Err(RingError::DeviceLost {
                    device,
                    addr,
                    reason,
                }) if device > 0 && device < self.layout.devices.len() => {
                    self.lose(device, addr, reason, &mut loss)?
                }
                Err(e) => return Err(e),
            }
        }
        self.contexts[0].extend_from_slice(tokens);
        self.recovered(loss, self.contexts[0].len() - tokens.len());
        Ok(&self.logits)
    }

    fn n_past(&self) -> usize {
        self.contexts[0].len()
    }

    fn n_ctx(&self) -> usize {
        self.options.n_ctx
    }

    /// Cuts the context; a ring that holds more forgets it too (a new ring, still
    /// catching up, replays only what is kept).
    fn truncate(&mut self, n: usize) -> Result<(), RingError> {
        BatchForward::truncate(self, 0, n)
    }
}

/// Every slot's context is kept here, so a new ring (after a loss or a device's return)
/// replays all of them in the first evaluation after it is connected.
impl BatchForward for ResilientRing<'_> {
    type Error = RingError;

    fn n_slots(&self) -> usize {
        self.contexts.len()
    }

    fn n_ctx(&self) -> usize {
        self.options.n_ctx
    }

    fn n_batch(&self) -> usize {
        // As `Session` clamps it.
        self.options.n_batch.clamp(1, self.options.n_ctx.max(1))
    }

    fn n_vocab(&self) -> usize {
        self.model.hparams().n_vocab
    }

    fn n_past(&self, slot: usize) -> usize {
        self.contexts.get(slot).map_or(0, Vec::len)
    }

    /// Cuts the slot's context; a ring that holds more forgets it too (a new ring, still
    /// catching up, replays only what is kept).
    fn truncate(&mut self, slot: usize, n: usize) -> Result<(), RingError> {
        let n_slots = self.contexts.len();
        let context = self
            .contexts
            .get_mut(slot)
            .ok_or(ModelError::UnknownSlot { slot, n_slots })?;
        context.truncate(n);
        match &mut self.inner {
            Inner::Down => Ok(()),
            Inner::Ring(head) if BatchForward::n_past(head.as_ref(), slot) > n => {
                BatchForward::truncate(head.as_mut(), slot, n)
            }
            Inner::Alone(session) if session.slot_n_past(slot) > n => {
                Ok(session.truncate_slot(slot, n)?)
            }
            _ => Ok(()),
        }
    }

    fn eval_batch(&mut self, seqs: &[SeqTokens<'_>]) -> Result<&[f32], RingError> {
        self.eval_batch_rows_or_last(seqs, &[])
    }
}

/// A replayed entry holds its slot's missing tail before its tokens, so the rows asked
/// for are still its last ones.
impl BatchRowLogits for ResilientRing<'_> {
    fn eval_batch_rows(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<&[f32], RingError> {
        check_rows(seqs, rows)?;
        self.eval_batch_rows_or_last(seqs, rows)
    }
}

impl ResilientRing<'_> {
    /// [`BatchForward::eval_batch`], or with `rows` given (checked),
    /// [`BatchRowLogits::eval_batch_rows`].
    fn eval_batch_rows_or_last(
        &mut self,
        seqs: &[SeqTokens<'_>],
        rows: &[usize],
    ) -> Result<&[f32], RingError> {
        let contexts = &self.contexts;
        check_entries(seqs, contexts.len(), self.options.n_ctx, |slot| {
            contexts[slot].len()
        })?;
        let mut loss: Option<Instant> = None;
        loop {
            if matches!(self.inner, Inner::Down) {
                self.reconnect(ReplanCause::DeviceLost)?;
            }
            match self.try_eval_batch(seqs, rows) {
                Ok(()) => break,
                Err(RingError::DeviceLost {
                    device,
                    addr,
                    reason,
                }) if device > 0 && device < self.layout.devices.len() => {
                    self.lose(device, addr, reason, &mut loss)?
                }
                Err(e) => return Err(e),
            }
        }
        let before: usize = self.contexts.iter().map(Vec::len).sum();
        for seq in seqs {
            self.contexts[seq.slot].extend_from_slice(seq.tokens);
        }
        self.recovered(loss, before);
        Ok(&self.logits)
    }
}

/// Rows of the last evaluation's tokens, wherever the inner ring or session holds them
/// (after a replay, further down its last batch).
impl RowLogits for ResilientRing<'_> {
    fn n_batch(&self) -> usize {
        self.options.n_batch
    }

    fn row_logits(
        &mut self,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
    ) -> Result<(), RingError> {
        let start = rows.start as isize + self.row_shift;
        if start < 0 {
            return Err(ModelError::RowsOutOfBatch {
                rows: format!("{}..{}", rows.start, rows.end),
                batch: rows.end,
                n_batch: self.options.n_batch,
            }
            .into());
        }
        let inner_rows = start as usize..start as usize + rows.len();
        match &mut self.inner {
            Inner::Down => Err(RingError::Setup("the ring is down".into())),
            Inner::Ring(head) => head.row_logits(inner_rows, out),
            Inner::Alone(session) => Ok(session.logits_rows(inner_rows, out)?),
        }
    }
}
