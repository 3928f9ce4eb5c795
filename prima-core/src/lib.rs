//! Prima's engine: reads GGUF models zero-copy, runs them through a compute backend
//! loaded as a plugin, and turns text into tokens and back.
//!
//! See ARCHITECTURE.md at the repository root for the map of the crates and the path of
//! one token through them.

pub mod batch;
pub mod chat;
pub mod discovery;
pub mod fuzzing;
pub mod generate;
pub mod gguf;
pub mod halda;
pub mod manifest;
pub mod model;
pub mod perplexity;
pub mod plugin;
pub mod profile;
pub mod prp;
pub mod routes;
pub mod sampler;
pub mod server;
pub mod speculative;
pub mod tokenizer;
