//! Prima's engine: reads GGUF models zero-copy, runs them through a compute backend
//! loaded as a plugin, and turns text into tokens and back, on one device.
//!
//! Not here: devices, plans and the ring (`prima-cluster`), the HTTP server
//! (`prima-server`), the command line (`prima-cli`), the plugin ABIs (`prima-abi`).
//!
//! See ARCHITECTURE.md at the repository root for the map of the crates and the path of
//! one token through them.

pub mod batch;
pub mod chat;
pub mod generate;
pub mod gguf;
pub mod model;
pub mod perplexity;
pub mod plugin;
pub mod sampler;
pub mod speculative;
pub mod tokenizer;
