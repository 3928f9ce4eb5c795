//! The ring protocol: what the head and the nodes say to each other.
//!
//! Every frame starts with one kind byte. Control frames (`C`) carry a JSON
//! [`Control`] message: setup, readiness, health, statistics, shutdown — rare and small,
//! so readable beats compact. Activation frames (`A`) are the data path: a fixed 24-byte
//! little-endian header, the batch's spans (which slot's rows at which positions, 12
//! bytes each) and the hidden states as raw f32 or f16, nothing else.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use prima_core::batch::SeqSpan;
use prima_core::gguf::GgufFile;

/// Version of this protocol; a peer speaking another one is refused at setup.
/// 2: every connection opens with the link handshake of [`super::secure`].
/// 3: activation frames carry the batch's spans (several slots per batch), the setup
///    the number of slots.
/// 4: several batches (micro-batches of different slots) may be in the ring at once,
///    their frames interleaved; a frame's `seq` says which batch it belongs to.
/// 5: a node answers pings before a setup or profile request, echoing their padding
///    (the head times its links with them before it plans).
/// 6: the output layer may run on the device that runs the last layer ([`Setup::output`]):
///    a frame lists the rows whose logits the head wants, and that device's last frame
///    of a batch carries their logits after the hidden states.
/// 7: a head that runs no layer in round 0 sends that round's frames as token ids
///    ([`WireType::Tokens`]); the next device embeds them. The output device returns
///    only logits unless the head asks for the hidden states too
///    ([`OutputSetup::hidden`], [`WireType::LogitsOnly`]).
pub const PROTOCOL_VERSION: u32 = 7;

const KIND_CONTROL: u8 = b'C';
const KIND_ACTIVATIONS: u8 = b'A';
const HEADER_BYTES: usize = 24;
/// Bytes of one span in an activation frame: slot, start, rows (u32 each).
const SPAN_BYTES: usize = 12;

/// Why a frame could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("empty frame")]
    Empty,
    #[error("unknown frame kind {0:#04x}")]
    UnknownKind(u8),
    #[error("malformed control message: {0}")]
    BadControl(#[from] serde_json::Error),
    #[error("activation frame of {len} bytes is shorter than its {HEADER_BYTES}-byte header")]
    ShortHeader { len: usize },
    #[error("activation frame: unknown wire type {0}")]
    BadWireType(u8),
    #[error("activation frame: token ids where hidden states were due (only the first device after a head that runs no layer gets tokens)")]
    TokensUnexpected,
    #[error("activation frame: {0}")]
    BadSpans(String),
    #[error("activation frame holds {found} bytes of data, {expected} expected for {n_tokens} tokens × {n_embd}")]
    BadLength {
        found: usize,
        expected: usize,
        n_tokens: u32,
        n_embd: usize,
    },
}

/// Which channel a connection is, said in its first frame.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Head → node: setup, health, statistics, shutdown.
    Control,
    /// Previous device → this one: activations.
    Data,
}

/// Identifies a model file without reading its weights: the size and a SHA-256 of the
/// header and tensor index (everything before the tensor data).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ModelFingerprint {
    pub file_bytes: u64,
    pub header_sha256: String,
}

impl ModelFingerprint {
    pub fn of(gguf: &GgufFile) -> ModelFingerprint {
        // A file without tensors may end before its (aligned) data offset.
        let bytes = gguf.bytes();
        let header = &bytes[..(gguf.data_offset().min(bytes.len() as u64)) as usize];
        ModelFingerprint {
            file_bytes: gguf.file_size(),
            header_sha256: hex::encode(Sha256::digest(header)),
        }
    }
}

/// How activations travel between devices.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum WireType {
    /// Exact: the ring computes bit-for-bit what one device would.
    #[default]
    F32,
    /// Half the bytes per hop; rounds the residual stream at every hop.
    F16,
    /// Not hidden states but the batch's token ids, 4 bytes a row: the head's round-0
    /// frame when it runs no layer in that round, so a prompt crosses the first link as
    /// its tokens (a 15-token prompt of a 2048-wide model: 60 bytes, not 123 KB, which a
    /// fresh TCP connection needs several round trips to carry). The device that gets it
    /// embeds the tokens itself. A frame's kind, never a ring's setting.
    Tokens,
    /// No hidden states: the output device's last frame of a batch when the head wants
    /// only the logits ([`OutputSetup::hidden`] false), which follow at once. A frame's
    /// kind, never a ring's setting.
    LogitsOnly,
}

impl WireType {
    fn id(self) -> u8 {
        match self {
            WireType::F32 => 0,
            WireType::F16 => 1,
            WireType::Tokens => 2,
            WireType::LogitsOnly => 3,
        }
    }

    fn from_id(id: u8) -> Result<WireType, ProtocolError> {
        match id {
            0 => Ok(WireType::F32),
            1 => Ok(WireType::F16),
            2 => Ok(WireType::Tokens),
            3 => Ok(WireType::LogitsOnly),
            other => Err(ProtocolError::BadWireType(other)),
        }
    }

    /// Bytes per value of a hidden state (per row for [`WireType::Tokens`]).
    fn bytes(self) -> usize {
        match self {
            WireType::F32 | WireType::Tokens => 4,
            WireType::F16 => 2,
            WireType::LogitsOnly => 0,
        }
    }

    /// Whether a ring may use this type for its hidden states (the others are kinds of
    /// frame).
    pub fn carries_hidden_states(self) -> bool {
        matches!(self, WireType::F32 | WireType::F16)
    }
}

/// What a device does with a streamed window's pages once it has computed it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReleasePolicy {
    /// Leave eviction to the kernel's LRU.
    None,
    /// Release the window just used (the most recently used one): under cyclic access
    /// it is the one needed furthest in the future.
    #[default]
    Mru,
}

/// How a release is asked of the kernel (see [`prima_core::gguf::PageHint`]).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseMethod {
    #[default]
    Pageout,
    Cold,
    Dontneed,
}

/// Where a device sends its output.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum NextHop {
    /// Another node, at this address.
    Node { addr: String },
    /// Back to the head: the address the control connection came from, at this port.
    Head { port: u16 },
}

/// The head's instructions to one node.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    pub protocol: u32,
    pub model: ModelFingerprint,
    /// This node's position in the ring (the head is 0) and the ring's size.
    pub device: usize,
    pub n_devices: usize,
    /// Rounds per token (k).
    pub rounds: usize,
    /// The layers this node runs in each round it takes part in.
    pub windows: Vec<RoundWindow>,
    /// GPU layers n_m of each window, in the order of `windows` (the first ones of each
    /// run on the node's GPU backend). Left out when empty (no GPU layers), so that older
    /// nodes accept a setup without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_layers: Vec<usize>,
    /// Positions of each slot.
    pub n_ctx: usize,
    pub n_batch: usize,
    /// Independent contexts (a KV cache each) this node keeps: continuous batching's
    /// slots. Left out when 1, so that an older node refuses a one-slot setup by its
    /// protocol version rather than by an unknown field.
    #[serde(default = "one_slot", skip_serializing_if = "is_one_slot")]
    pub n_slots: usize,
    pub next: NextHop,
    pub prefetch: bool,
    pub release: ReleasePolicy,
    pub release_method: ReleaseMethod,
    pub wire: WireType,
    /// The node that runs the model's last layer also runs the output layer and sends
    /// the head the logits of the rows each frame lists; absent: the head runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputSetup>,
}

/// How the device that runs the output layer returns logits.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OutputSetup {
    /// Only each row's `top_k` highest logits (ids and values; the head fills the rest
    /// with −∞), 0: every logit. Greedy decoding, and a sampler whose own top-k is at
    /// most this, see what the whole row gives them.
    pub top_k: u32,
    /// The hidden states come back with the logits, for the head to compute any row's
    /// logits after the fact (`RowLogits`: perplexity, a draft's verification); false:
    /// only the logits, so a prompt's return is a few hundred bytes, not rows × n_embd
    /// floats.
    #[serde(default = "hidden_by_default")]
    pub hidden: bool,
}

fn hidden_by_default() -> bool {
    true
}

fn one_slot() -> usize {
    1
}

fn is_one_slot(n: &usize) -> bool {
    *n == 1
}

/// One window of one round.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoundWindow {
    pub round: usize,
    pub layers: Range<usize>,
}

/// A node's answer to a setup it accepted.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    pub host: String,
    pub backend: String,
    pub layers: usize,
    pub resident_windows: usize,
    pub streamed_windows: usize,
    /// Bytes of weights read from storage per token by plan (the streamed layers).
    pub streamed_bytes: u64,
    pub mem_budget: Option<u64>,
}

/// One activation message processed by one device.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PassStats {
    pub seq: u64,
    pub round: usize,
    pub n_tokens: usize,
    /// Blocked waiting for the previous device's activations.
    pub wait_ms: f64,
    /// Running this device's window (0 for a relay).
    pub compute_ms: f64,
    /// Handing the activations to the transport.
    pub send_ms: f64,
    /// Major page faults while computing (weights read from disk).
    pub major_faults: u64,
    /// Bytes this process read from storage while computing.
    pub disk_read_bytes: u64,
    /// The device's available memory after the pass, in bytes (0 where unknown): MemAvailable,
    /// or less under a cgroup limit.
    pub mem_available: u64,
    /// Its resident-expert cache (a MoE model whose experts it streams; 0 otherwise):
    /// chosen experts found resident, chosen experts streamed, and their bytes.
    #[serde(default)]
    pub expert_hits: u64,
    #[serde(default)]
    pub expert_misses: u64,
    #[serde(default)]
    pub expert_streamed_bytes: u64,
}

/// The device's memory when its session began (before it read its windows), the baseline
/// of the paper's memory pressure: (baseline − MemAvailable) ÷ MemTotal. Inside a cgroup
/// both figures are the cgroup's (its limit as the total), so pressure is measured against
/// the memory the device really has.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MemoryBaseline {
    pub mem_total: u64,
    pub mem_available_at_setup: u64,
}

impl MemoryBaseline {
    pub fn now() -> MemoryBaseline {
        let (avail, total) = super::counters::mem_available_total().unwrap_or((0, 0));
        MemoryBaseline {
            mem_total: total,
            mem_available_at_setup: avail,
        }
    }

    /// Peak memory pressure over `passes`, as a fraction of MemTotal.
    pub fn peak_pressure(&self, passes: &[PassStats]) -> f64 {
        let lowest = passes
            .iter()
            .map(|p| p.mem_available)
            .filter(|&a| a > 0)
            .min()
            .unwrap_or(self.mem_available_at_setup);
        if self.mem_total == 0 {
            return 0.0;
        }
        self.mem_available_at_setup.saturating_sub(lowest) as f64 / self.mem_total as f64
    }
}

/// Control messages.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    Hello {
        protocol: u32,
        role: Role,
    },
    Setup(Box<Setup>),
    Ready(Ready),
    Refused {
        reason: String,
    },
    /// `pad` (echoed in the `Pong`) gives a link probe the size of a hidden state.
    Ping {
        seq: u64,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        pad: String,
    },
    Pong {
        seq: u64,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        pad: String,
    },
    /// Asks a node for its device profile (instead of a setup); answered with `Profile`.
    ProfileRequest,
    Profile {
        profile: serde_json::Value,
    },
    StatsRequest,
    Stats {
        passes: Vec<PassStats>,
        memory: MemoryBaseline,
    },
    /// End the session; with `exit` the node process exits too.
    Shutdown {
        exit: bool,
    },
}

/// Header of an activation frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activations {
    /// Ring pass number, counted by the head (one per batch per round).
    pub seq: u64,
    /// Rows of the batch, all spans together.
    pub n_tokens: u32,
    pub round: u16,
    pub wire: WireType,
    /// Rows of the batch whose logits the head wants from the device that runs the
    /// output layer (a table of u32 row numbers after the spans); 0 when the head runs
    /// it.
    pub logit_rows: u32,
}

/// The spans of an activation frame (which slot's rows, at which positions), still in
/// wire format; checked when decoded: at least one, none empty, their rows adding up to
/// the frame's.
#[derive(Debug, Clone, Copy)]
pub struct SpanTable<'a>(&'a [u8]);

impl SpanTable<'_> {
    pub fn len(&self) -> usize {
        self.0.len() / SPAN_BYTES
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = SeqSpan> + '_ {
        self.0.chunks_exact(SPAN_BYTES).map(|b| {
            let at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]) as usize;
            SeqSpan {
                slot: at(0),
                start: at(4),
                len: at(8),
            }
        })
    }

    /// The spans into `out`, replacing its content (a buffer reused frame after frame).
    pub fn read_into(&self, out: &mut Vec<SeqSpan>) {
        out.clear();
        out.extend(self.iter());
    }
}

/// A decoded frame.
#[derive(Debug)]
pub enum Frame<'a> {
    Control(Control),
    /// The header, the spans and the raw payload, still in wire format.
    Activations(Activations, SpanTable<'a>, &'a [u8]),
}

pub fn encode_control(msg: &Control) -> Vec<u8> {
    let mut out = vec![KIND_CONTROL];
    // Serialising these plain data types cannot fail.
    serde_json::to_writer(&mut out, msg).unwrap_or_default();
    out
}

/// Writes an activation frame for `x` (`n_tokens` rows, the rows of `spans` one after
/// another) into `out`, replacing its content.
pub fn encode_activations(out: &mut Vec<u8>, header: &Activations, spans: &[SeqSpan], x: &[f32]) {
    encode_activations_for(out, header, spans, &[], x);
}

/// [`encode_activations`] with the rows whose logits the head wants (`header.logit_rows`
/// is taken from `rows`).
pub fn encode_activations_for(
    out: &mut Vec<u8>,
    header: &Activations,
    spans: &[SeqSpan],
    rows: &[u32],
    x: &[f32],
) {
    encode_head(out, header, spans, rows, x.len() * header.wire.bytes());
    match header.wire {
        WireType::F32 => {
            for v in x {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        WireType::F16 => {
            for v in x {
                out.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes());
            }
        }
        // Hidden states are never sent as tokens (the caller sends tokens with
        // `encode_tokens`), and a logits-only frame has none.
        WireType::Tokens | WireType::LogitsOnly => {}
    }
}

/// Writes an activation frame that carries the batch's token ids (`tokens`, one per row)
/// instead of hidden states ([`WireType::Tokens`]) into `out`, replacing its content.
pub fn encode_tokens(
    out: &mut Vec<u8>,
    header: &Activations,
    spans: &[SeqSpan],
    rows: &[u32],
    tokens: &[u32],
) {
    let header = Activations {
        wire: WireType::Tokens,
        ..*header
    };
    encode_head(out, &header, spans, rows, tokens.len() * 4);
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
}

/// The header, spans and logit-row table of an activation frame into `out` (cleared),
/// with room for `payload` more bytes.
fn encode_head(
    out: &mut Vec<u8>,
    header: &Activations,
    spans: &[SeqSpan],
    rows: &[u32],
    payload: usize,
) {
    out.clear();
    out.reserve(HEADER_BYTES + spans.len() * SPAN_BYTES + rows.len() * 4 + payload);
    out.push(KIND_ACTIVATIONS);
    out.push(header.wire.id());
    out.extend_from_slice(&header.round.to_le_bytes());
    out.extend_from_slice(&(spans.len() as u32).to_le_bytes());
    out.extend_from_slice(&header.seq.to_le_bytes());
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    out.extend_from_slice(&header.n_tokens.to_le_bytes());
    for s in spans {
        for v in [s.slot, s.start, s.len] {
            out.extend_from_slice(&(v as u32).to_le_bytes());
        }
    }
    for r in rows {
        out.extend_from_slice(&r.to_le_bytes());
    }
}

pub fn decode(frame: &[u8]) -> Result<Frame<'_>, ProtocolError> {
    match frame.first() {
        None => Err(ProtocolError::Empty),
        Some(&KIND_CONTROL) => Ok(Frame::Control(serde_json::from_slice(&frame[1..])?)),
        Some(&KIND_ACTIVATIONS) => {
            if frame.len() < HEADER_BYTES {
                return Err(ProtocolError::ShortHeader { len: frame.len() });
            }
            let u32_at =
                |i: usize| u32::from_le_bytes([frame[i], frame[i + 1], frame[i + 2], frame[i + 3]]);
            let mut seq = [0u8; 8];
            seq.copy_from_slice(&frame[8..16]);
            let header = Activations {
                wire: WireType::from_id(frame[1])?,
                round: u16::from_le_bytes([frame[2], frame[3]]),
                seq: u64::from_le_bytes(seq),
                n_tokens: u32_at(20),
                logit_rows: u32_at(16),
            };
            let rest = &frame[HEADER_BYTES..];
            let n_spans = u32_at(4) as usize;
            let table = n_spans
                .checked_mul(SPAN_BYTES)
                .filter(|&b| b <= rest.len())
                .ok_or_else(|| {
                    ProtocolError::BadSpans(format!(
                        "{n_spans} spans do not fit in {} bytes",
                        rest.len()
                    ))
                })?;
            let spans = SpanTable(&rest[..table]);
            check_spans(&spans, header.n_tokens)?;
            Ok(Frame::Activations(header, spans, &rest[table..]))
        }
        Some(&other) => Err(ProtocolError::UnknownKind(other)),
    }
}

/// At least one span, none empty, rows adding up to `n_tokens`.
fn check_spans(spans: &SpanTable<'_>, n_tokens: u32) -> Result<(), ProtocolError> {
    if spans.is_empty() {
        return Err(ProtocolError::BadSpans("no span".into()));
    }
    let mut rows = 0u64;
    for s in spans.iter() {
        if s.len == 0 {
            return Err(ProtocolError::BadSpans(format!(
                "slot {}: an empty span",
                s.slot
            )));
        }
        rows += s.len as u64;
    }
    if rows != u64::from(n_tokens) {
        return Err(ProtocolError::BadSpans(format!(
            "spans of {rows} rows in a frame of {n_tokens}"
        )));
    }
    Ok(())
}

/// The rows of a frame's batch whose logits the head wants (checked: each below the
/// frame's rows), into `out`.
pub fn read_logit_rows(
    header: &Activations,
    payload: &[u8],
    out: &mut Vec<u32>,
) -> Result<(), ProtocolError> {
    out.clear();
    let table = rows_table(header, payload)?;
    for b in table.chunks_exact(4) {
        let row = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if row >= header.n_tokens {
            return Err(ProtocolError::BadSpans(format!(
                "logits asked of row {row} of a batch of {}",
                header.n_tokens
            )));
        }
        out.push(row);
    }
    Ok(())
}

fn rows_table<'a>(header: &Activations, payload: &'a [u8]) -> Result<&'a [u8], ProtocolError> {
    let bytes = (header.logit_rows as usize)
        .checked_mul(4)
        .filter(|&b| b <= payload.len())
        .ok_or_else(|| {
            ProtocolError::BadSpans(format!(
                "a table of {} logit rows does not fit in {} bytes",
                header.logit_rows,
                payload.len()
            ))
        })?;
    Ok(&payload[..bytes])
}

/// Converts an activation payload into `out` (`n_tokens × n_embd` floats); returns what
/// follows the hidden states: the logits section of the output device's frame (see
/// [`append_logits`]), empty in any other.
pub fn read_payload<'a>(
    header: &Activations,
    payload: &'a [u8],
    n_embd: usize,
    out: &mut [f32],
) -> Result<&'a [u8], ProtocolError> {
    if header.wire == WireType::Tokens {
        return Err(ProtocolError::TokensUnexpected);
    }
    let payload = &payload[rows_table(header, payload)?.len()..];
    let values = header.n_tokens as usize * n_embd;
    let expected = values * header.wire.bytes();
    if payload.len() < expected || out.len() != values {
        return Err(ProtocolError::BadLength {
            found: payload.len(),
            expected,
            n_tokens: header.n_tokens,
            n_embd,
        });
    }
    let (hidden, logits) = payload.split_at(expected);
    match header.wire {
        WireType::F32 => {
            for (o, b) in out.iter_mut().zip(hidden.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WireType::F16 => {
            for (o, b) in out.iter_mut().zip(hidden.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        // Nothing came: `out` keeps what it held.
        WireType::Tokens | WireType::LogitsOnly => {}
    }
    Ok(logits)
}

/// The token ids of a [`WireType::Tokens`] frame into `out` (replacing its content), each
/// checked against the vocabulary; returns what follows them (empty: only the head sends
/// tokens, and only into the ring).
pub fn read_tokens<'a>(
    header: &Activations,
    payload: &'a [u8],
    n_vocab: usize,
    out: &mut Vec<u32>,
) -> Result<&'a [u8], ProtocolError> {
    let payload = &payload[rows_table(header, payload)?.len()..];
    let n = header.n_tokens as usize;
    if payload.len() < n * 4 {
        return Err(ProtocolError::BadLength {
            found: payload.len(),
            expected: n * 4,
            n_tokens: header.n_tokens,
            n_embd: 1,
        });
    }
    let (ids, rest) = payload.split_at(n * 4);
    out.clear();
    for b in ids.chunks_exact(4) {
        let id = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if id as usize >= n_vocab {
            return Err(ProtocolError::BadSpans(format!(
                "token {id} past the vocabulary of {n_vocab}"
            )));
        }
        out.push(id);
    }
    Ok(rest)
}

/// Appends the logits of a frame's listed rows (`logits`: one row of `n_vocab` after
/// another) after its hidden states: a u32 `top_k`, then per row either every logit
/// (`top_k` 0, f32) or its `top_k` highest as (u32 id, f32 logit) pairs, highest first,
/// ties to the lower id (as the sampler orders them).
pub fn append_logits(out: &mut Vec<u8>, top_k: u32, n_vocab: usize, logits: &[f32]) {
    // Asked for the whole vocabulary or more: every logit, said so.
    let top_k = if top_k as usize >= n_vocab { 0 } else { top_k };
    out.extend_from_slice(&top_k.to_le_bytes());
    if top_k == 0 {
        for v in logits {
            out.extend_from_slice(&v.to_le_bytes());
        }
        return;
    }
    let k = top_k as usize;
    let mut ids: Vec<u32> = Vec::with_capacity(n_vocab);
    for row in logits.chunks_exact(n_vocab) {
        ids.clear();
        ids.extend(0..n_vocab as u32);
        let order = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
        ids.select_nth_unstable_by(k - 1, order);
        ids.truncate(k);
        ids.sort_unstable_by(order);
        for &id in &ids {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&row[id as usize].to_le_bytes());
        }
    }
}

/// Reads a logits section ([`append_logits`]) of `rows` rows into `out` (`rows ×
/// n_vocab`), a top-k row's other logits −∞.
pub fn read_logits(
    section: &[u8],
    rows: usize,
    n_vocab: usize,
    out: &mut [f32],
) -> Result<(), ProtocolError> {
    let bad = |why: String| ProtocolError::BadSpans(format!("logits section: {why}"));
    if section.len() < 4 {
        return Err(bad(format!("{} bytes, no header", section.len())));
    }
    if out.len() != rows * n_vocab {
        return Err(bad(format!(
            "{} rows of {n_vocab} into {} floats",
            rows,
            out.len()
        )));
    }
    let top_k = u32::from_le_bytes([section[0], section[1], section[2], section[3]]) as usize;
    let data = &section[4..];
    let f32_at = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if top_k == 0 {
        if data.len() != rows * n_vocab * 4 {
            return Err(bad(format!(
                "{} bytes for {rows} rows of {n_vocab} logits",
                data.len()
            )));
        }
        for (o, b) in out.iter_mut().zip(data.chunks_exact(4)) {
            *o = f32_at(b);
        }
        return Ok(());
    }
    if top_k > n_vocab || data.len() != rows * top_k * 8 {
        return Err(bad(format!(
            "{} bytes for {rows} rows of the top {top_k} of {n_vocab}",
            data.len()
        )));
    }
    out.fill(f32::NEG_INFINITY);
    for (row, pairs) in out
        .chunks_exact_mut(n_vocab)
        .zip(data.chunks_exact(top_k * 8))
    {
        for p in pairs.chunks_exact(8) {
            let id = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
            let slot = row
                .get_mut(id)
                .ok_or_else(|| bad(format!("token {id} of a vocabulary of {n_vocab}")))?;
            *slot = f32_at(&p[4..]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_round_trip_in_both_wire_types() {
        let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
        let spans = [
            SeqSpan {
                slot: 2,
                start: 40,
                len: 2,
            },
            SeqSpan {
                slot: 0,
                start: 7,
                len: 1,
            },
        ];
        for wire in [WireType::F32, WireType::F16] {
            let header = Activations {
                seq: 7,
                n_tokens: 3,
                round: 2,
                wire,
                logit_rows: 0,
            };
            let mut buf = Vec::new();
            encode_activations(&mut buf, &header, &spans, &x);
            let Frame::Activations(h, table, payload) = decode(&buf).unwrap() else {
                panic!("not an activation frame");
            };
            assert_eq!(h, header);
            assert_eq!(table.iter().collect::<Vec<_>>(), spans);
            let mut out = vec![0.0; 12];
            read_payload(&h, payload, 4, &mut out).unwrap();
            assert_eq!(out, x, "these values are exact in f16 too");
            let err = read_payload(&h, &payload[1..], 4, &mut out).unwrap_err();
            assert!(err.to_string().contains("3 tokens × 4"), "{err}");
        }
    }

    #[test]
    fn a_token_frame_round_trips_and_is_refused_where_hidden_states_are_due() {
        let header = Activations {
            seq: 1,
            n_tokens: 3,
            round: 0,
            wire: WireType::F16,
            logit_rows: 1,
        };
        let spans = [SeqSpan {
            slot: 0,
            start: 4,
            len: 3,
        }];
        let mut buf = Vec::new();
        encode_tokens(&mut buf, &header, &spans, &[2], &[7, 0, 99]);
        assert_eq!(buf.len(), HEADER_BYTES + SPAN_BYTES + 4 + 3 * 4);
        let Frame::Activations(h, _, payload) = decode(&buf).unwrap() else {
            panic!("not an activation frame");
        };
        assert_eq!(h.wire, WireType::Tokens);
        let mut tokens = Vec::new();
        assert!(read_tokens(&h, payload, 100, &mut tokens)
            .unwrap()
            .is_empty());
        assert_eq!(tokens, [7, 0, 99]);
        let err = read_tokens(&h, payload, 99, &mut tokens).unwrap_err();
        assert!(
            err.to_string()
                .contains("token 99 past the vocabulary of 99"),
            "{err}"
        );
        let err = read_tokens(&h, &payload[..payload.len() - 1], 100, &mut tokens).unwrap_err();
        assert!(matches!(err, ProtocolError::BadLength { .. }), "{err}");
        let err = read_payload(&h, payload, 2, &mut [0.0; 6]).unwrap_err();
        assert!(matches!(err, ProtocolError::TokensUnexpected), "{err}");

        // The output device's answer without hidden states: the logits follow the table.
        let back = Activations {
            wire: WireType::LogitsOnly,
            ..header
        };
        encode_activations_for(&mut buf, &back, &spans, &[2], &[1.0; 6]);
        append_logits(&mut buf, 0, 2, &[0.5, -0.5]);
        assert_eq!(buf.len(), HEADER_BYTES + SPAN_BYTES + 4 + 4 + 2 * 4);
        let Frame::Activations(h, _, payload) = decode(&buf).unwrap() else {
            panic!("not an activation frame");
        };
        let mut hidden = [7.0f32; 6];
        let section = read_payload(&h, payload, 2, &mut hidden).unwrap();
        assert_eq!(hidden, [7.0; 6], "nothing read into the hidden states");
        let mut logits = [0.0f32; 2];
        read_logits(section, 1, 2, &mut logits).unwrap();
        assert_eq!(logits, [0.5, -0.5]);
        assert!(!WireType::LogitsOnly.carries_hidden_states());
        assert!(!WireType::Tokens.carries_hidden_states());
    }

    #[test]
    fn logit_rows_and_logits_round_trip_whole_and_as_top_k() {
        let header = Activations {
            seq: 3,
            n_tokens: 3,
            round: 0,
            wire: WireType::F32,
            logit_rows: 2,
        };
        let spans = [SeqSpan {
            slot: 0,
            start: 0,
            len: 3,
        }];
        let x: Vec<f32> = (0..6).map(|i| i as f32).collect();
        // Two rows of a vocabulary of 5; row 1 has a tie at its second place.
        let logits = [0.5f32, 3.0, -1.0, 2.0, 1.0, 7.0, 2.0, 2.0, -4.0, 0.0];
        for top_k in [0u32, 2, 9] {
            let mut buf = Vec::new();
            encode_activations_for(&mut buf, &header, &spans, &[0, 2], &x);
            append_logits(&mut buf, top_k, 5, &logits);
            let Frame::Activations(h, _, payload) = decode(&buf).unwrap() else {
                panic!("not an activation frame");
            };
            assert_eq!(h, header);
            let mut rows = Vec::new();
            read_logit_rows(&h, payload, &mut rows).unwrap();
            assert_eq!(rows, [0, 2]);
            let mut hidden = vec![0.0; 6];
            let section = read_payload(&h, payload, 2, &mut hidden).unwrap();
            assert_eq!(hidden, x);
            let mut out = vec![0.0; 10];
            read_logits(section, 2, 5, &mut out).unwrap();
            if top_k == 2 {
                let ninf = f32::NEG_INFINITY;
                assert_eq!(
                    out,
                    [ninf, 3.0, ninf, 2.0, ninf, 7.0, 2.0, ninf, ninf, ninf]
                );
            } else {
                assert_eq!(out, logits);
            }
            let err = read_logits(&section[..section.len() - 1], 2, 5, &mut out).unwrap_err();
            assert!(err.to_string().contains("logits section"), "{err}");
        }
        // A row past the batch.
        let mut buf = Vec::new();
        encode_activations_for(&mut buf, &header, &spans, &[3], &x);
        let Frame::Activations(h, _, payload) = decode(&buf).unwrap() else {
            panic!("not an activation frame");
        };
        let err = read_logit_rows(&h, payload, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("row 3 of a batch of 3"), "{err}");
    }

    #[test]
    fn spans_that_do_not_describe_the_rows_are_refused() {
        let span = |slot, len| SeqSpan {
            slot,
            start: 0,
            len,
        };
        let header = Activations {
            seq: 1,
            n_tokens: 2,
            round: 0,
            wire: WireType::F32,
            logit_rows: 0,
        };
        let x = [0.0f32; 2];
        let mut buf = Vec::new();
        for (spans, what) in [
            (vec![], "no span"),
            (vec![span(0, 1), span(1, 0)], "empty span"),
            (vec![span(0, 1)], "spans of 1 rows"),
        ] {
            encode_activations(&mut buf, &header, &spans, &x);
            let err = decode(&buf).unwrap_err();
            assert!(err.to_string().contains(what), "{err}");
        }
        // A span count past the frame's end.
        encode_activations(&mut buf, &header, &[span(0, 2)], &x);
        buf[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = decode(&buf).unwrap_err();
        assert!(err.to_string().contains("do not fit"), "{err}");
    }

    #[test]
    fn a_one_slot_setup_reads_as_before_and_more_slots_are_said() {
        let mut setup: serde_json::Value = serde_json::json!({
            "protocol": PROTOCOL_VERSION,
            "model": {"file_bytes": 1, "header_sha256": "ab"},
            "device": 1, "n_devices": 2, "rounds": 1,
            "windows": [{"round": 0, "layers": {"start": 0, "end": 1}}],
            "n_ctx": 8, "n_batch": 4,
            "next": {"head": {"port": 1}},
            "prefetch": false, "release": "mru", "release_method": "pageout", "wire": "f32"
        });
        let parsed: Setup = serde_json::from_value(setup.clone()).unwrap();
        assert_eq!(parsed.n_slots, 1);
        assert!(!serde_json::to_string(&parsed).unwrap().contains("n_slots"));
        setup["n_slots"] = 4.into();
        let parsed: Setup = serde_json::from_value(setup).unwrap();
        assert_eq!(parsed.n_slots, 4);
        assert!(serde_json::to_string(&parsed)
            .unwrap()
            .contains("\"n_slots\":4"));
    }

    #[test]
    fn control_round_trips_and_garbage_is_named() {
        let msg = Control::Ping {
            seq: 3,
            pad: String::new(),
        };
        let Frame::Control(back) = decode(&encode_control(&msg)).unwrap() else {
            panic!("not a control frame");
        };
        assert_eq!(back, msg);
        assert!(matches!(
            decode(b"Z"),
            Err(ProtocolError::UnknownKind(b'Z'))
        ));
        assert!(matches!(
            decode(b"A123"),
            Err(ProtocolError::ShortHeader { len: 4 })
        ));
        let err = decode(b"C{\"type\":\"ping\",\"seq\":1,\"extra\":2}").unwrap_err();
        assert!(err.to_string().contains("extra"), "{err}");
    }
}
