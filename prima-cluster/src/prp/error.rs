use prima_core::model::ModelError;

use super::protocol::ProtocolError;
use super::WindowError;

/// Why the ring could not be set up or stopped working. Every variant names the device.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Windows(#[from] WindowError),
    #[error("{peer}: {source}")]
    Protocol { peer: String, source: ProtocolError },
    #[error("{0}")]
    Transport(String),
    /// A link that could not be set up or was broken: another cluster key, a plain peer,
    /// a frame that failed to authenticate.
    #[error("{peer}: {reason}")]
    Link { peer: String, reason: String },
    #[error("device {device} ({addr}) refused the setup: {reason}")]
    Refused {
        device: usize,
        addr: String,
        reason: String,
    },
    #[error("device {device} ({addr}) is gone: {reason}")]
    DeviceLost {
        device: usize,
        addr: String,
        reason: String,
    },
    #[error("{peer}: expected {expected}, got {got}")]
    Unexpected {
        peer: String,
        expected: &'static str,
        got: String,
    },
    #[error("{0}")]
    Setup(String),
    #[error("bad ring plan: {0}")]
    Plan(String),
    /// After a loss: no ring can be planned over the devices left (`failover.rs`).
    #[error("{lost} lost, and the devices left cannot hold the model: {reason}")]
    NoPlan { lost: String, reason: String },
}
