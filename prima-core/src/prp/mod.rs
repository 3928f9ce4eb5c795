//! Pipelined-ring parallelism: devices in a ring, the model cut into layer windows that
//! are assigned in ring order and visited in `k` rounds per token.
//!
//! Only the assignment itself lives here so far (a pure function); the node daemon, the
//! transport and prefetch/release come with the ring issue.

mod windows;

pub use windows::{assign_windows, layer_counts, LayerWindow, WindowError};
