//! Prima's cluster: the devices and the ring that runs one model across them.
//!
//! Layered bottom-up, each module importing only those above it in this list:
//! - [`profile`]: what each device can do (compute per format, memory, disk, links);
//! - [`halda`]: the planner — the paper's latency model and its ILPs (w_m, n_m, k);
//! - [`prp`]: the pipelined ring — windows, residency (prefetch and release), the head,
//!   the nodes, sealed links, failover; one device alone is the ring's smallest case;
//! - [`discovery`]: finding nodes on the LAN (mDNS);
//! - [`manifest`]: the declarative cluster (TOML) and its route checks;
//! - [`controller`]: manifest → profiles → plan → launch → ring, in-process.
//!
//! Not here: the model's arithmetic (`prima-core`), the HTTP server (`prima-server`),
//! parsing arguments or printing (`prima-cli`).

pub mod controller;
pub mod discovery;
pub mod halda;
pub mod manifest;
pub mod profile;
pub mod prp;
