//! The ring protocol: what the head and the nodes say to each other.
//!
//! Every frame starts with one kind byte. Control frames (`C`) carry a JSON
//! [`Control`] message: setup, readiness, health, statistics, shutdown — rare and small,
//! so readable beats compact. Activation frames (`A`) are the data path: a fixed 24-byte
//! little-endian header and the hidden states as raw f32 or f16, nothing else.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::gguf::GgufFile;

/// Version of this protocol; a peer speaking another one is refused at setup.
/// 2: every connection opens with the link handshake of [`super::secure`].
pub const PROTOCOL_VERSION: u32 = 2;

const KIND_CONTROL: u8 = b'C';
const KIND_ACTIVATIONS: u8 = b'A';
const HEADER_BYTES: usize = 24;

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
}

impl WireType {
    fn id(self) -> u8 {
        match self {
            WireType::F32 => 0,
            WireType::F16 => 1,
        }
    }

    fn from_id(id: u8) -> Result<WireType, ProtocolError> {
        match id {
            0 => Ok(WireType::F32),
            1 => Ok(WireType::F16),
            other => Err(ProtocolError::BadWireType(other)),
        }
    }

    fn bytes(self) -> usize {
        match self {
            WireType::F32 => 4,
            WireType::F16 => 2,
        }
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

/// How a release is asked of the kernel (see [`crate::gguf::PageHint`]).
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
    pub n_ctx: usize,
    pub n_batch: usize,
    pub next: NextHop,
    pub prefetch: bool,
    pub release: ReleasePolicy,
    pub release_method: ReleaseMethod,
    pub wire: WireType,
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
    Ping {
        seq: u64,
    },
    Pong {
        seq: u64,
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
    /// First position of the batch.
    pub start_pos: u32,
    pub n_tokens: u32,
    pub round: u16,
    pub wire: WireType,
}

/// A decoded frame.
#[derive(Debug)]
pub enum Frame<'a> {
    Control(Control),
    /// The header and the raw payload, still in wire format.
    Activations(Activations, &'a [u8]),
}

pub fn encode_control(msg: &Control) -> Vec<u8> {
    let mut out = vec![KIND_CONTROL];
    // Serialising these plain data types cannot fail.
    serde_json::to_writer(&mut out, msg).unwrap_or_default();
    out
}

/// Writes an activation frame for `x` (`n_tokens` rows) into `out`, replacing its content.
pub fn encode_activations(out: &mut Vec<u8>, header: &Activations, x: &[f32]) {
    out.clear();
    out.reserve(HEADER_BYTES + x.len() * header.wire.bytes());
    out.push(KIND_ACTIVATIONS);
    out.push(header.wire.id());
    out.extend_from_slice(&header.round.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&header.seq.to_le_bytes());
    out.extend_from_slice(&header.start_pos.to_le_bytes());
    out.extend_from_slice(&header.n_tokens.to_le_bytes());
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
                start_pos: u32_at(16),
                n_tokens: u32_at(20),
            };
            Ok(Frame::Activations(header, &frame[HEADER_BYTES..]))
        }
        Some(&other) => Err(ProtocolError::UnknownKind(other)),
    }
}

/// Converts an activation payload into `out` (`n_tokens × n_embd` floats).
pub fn read_payload(
    header: &Activations,
    payload: &[u8],
    n_embd: usize,
    out: &mut [f32],
) -> Result<(), ProtocolError> {
    let values = header.n_tokens as usize * n_embd;
    let expected = values * header.wire.bytes();
    if payload.len() != expected || out.len() != values {
        return Err(ProtocolError::BadLength {
            found: payload.len(),
            expected,
            n_tokens: header.n_tokens,
            n_embd,
        });
    }
    match header.wire {
        WireType::F32 => {
            for (o, b) in out.iter_mut().zip(payload.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WireType::F16 => {
            for (o, b) in out.iter_mut().zip(payload.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
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
        for wire in [WireType::F32, WireType::F16] {
            let header = Activations {
                seq: 7,
                start_pos: 40,
                n_tokens: 3,
                round: 2,
                wire,
            };
            let mut buf = Vec::new();
            encode_activations(&mut buf, &header, &x);
            let Frame::Activations(h, payload) = decode(&buf).unwrap() else {
                panic!("not an activation frame");
            };
            assert_eq!(h, header);
            let mut out = vec![0.0; 12];
            read_payload(&h, payload, 4, &mut out).unwrap();
            assert_eq!(out, x, "these values are exact in f16 too");
            let err = read_payload(&h, &payload[1..], 4, &mut out).unwrap_err();
            assert!(err.to_string().contains("3 tokens × 4"), "{err}");
        }
    }

    #[test]
    fn control_round_trips_and_garbage_is_named() {
        let msg = Control::Ping { seq: 3 };
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
