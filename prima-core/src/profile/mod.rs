//! Measuring this device: the figures Halda plans with and benchmarks report against.
//!
//! Only what is measured today lives here; each measurement is quick and touches nothing
//! outside the process (no scratch files, no page-cache drops).

mod memory;

pub use memory::{memory_read_bandwidth, MemoryBandwidth};
