//! Pipelined-ring parallelism: devices in a ring, the model cut into layer windows that
//! are assigned in ring order and visited in `k` rounds per token.
//!
//! - [`windows`]: the striped assignment of layers to devices (a pure function).
//! - [`protocol`]: the messages of the ring; [`link`] sends and receives them over a
//!   transport plugin's connections (the core never touches a socket).
//! - [`secure`]: every link authenticated and encrypted (Noise, the cluster [`key`]).
//! - [`head`]: device 0, a [`Forward`](prima_core::generate::Forward) whose layers run round
//!   the ring; [`node`]: the daemon every other device runs.
//! - [`micro_batch`]: how many micro-batches the head keeps in the ring at once.
//! - [`residency`]: which windows stay in memory, prefetch and release of the others.
//! - [`budget`]: how many bytes of weights a device keeps in memory (`--mem-budget`).
//! - [`failover`]: a ring head that plans the ring again when a device is lost, replays
//!   the context and goes on.
//! - [`alone`]: a device running the whole model alone, a ring of one, with the same
//!   residency when its weights do not fit its memory.
//! - [`expert_cache`]: experts as the unit of residency for a MoE model; [`expert_use`]:
//!   their use counts kept between runs.
//! - [`counters`]: page faults and disk reads, for the per-device timing.

pub mod alone;
pub mod budget;
pub mod counters;
mod error;
pub mod expert_cache;
pub mod expert_use;
pub mod failover;
pub mod head;
pub mod key;
mod link;
pub mod micro_batch;
pub mod node;
pub mod probe;
pub mod protocol;
pub mod residency;
pub mod run_ahead;
pub mod secure;
mod windows;

pub use error::RingError;
pub use head::{DeviceStats, NextRoute, RingGpus, RingHead, RingOptions};
pub use windows::{assign_windows, gpu_layers_of, layer_counts, LayerWindow, WindowError};
