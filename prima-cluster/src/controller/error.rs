//! What can go wrong between a manifest and a running ring, one variant per step: the
//! manifest, the devices' profiles, the plan, the local nodes, the ring's launch. Each
//! message names the manifest, device or file at fault; a variant that wraps a lower
//! layer's error also says it in its text, so a one-line message reads whole.

use std::path::PathBuf;

use crate::halda::model_profile::ModelProfileError;
use crate::halda::PlanError;
use crate::manifest::ManifestError;
use crate::profile::{ProfileError, ProfilesError};
use crate::prp::{RingError, WindowError};
use prima_core::plugin::PluginError;

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The manifest cannot be read, or does not hold together.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// `policy.profiles` names a file that cannot be read.
    #[error(transparent)]
    ProfilesFile(#[from] ProfilesError),
    /// `policy.profiles` has no profile for one of the manifest's devices.
    #[error("policy.profiles: {} has no device named '{device}'", path.display())]
    NoProfile { path: PathBuf, device: String },
    /// Measuring the head failed.
    #[error("device '{device}': profiling: {source}")]
    Profiling {
        device: String,
        #[source]
        source: ProfileError,
    },
    /// A node could not be reached, or asked for its profile.
    #[error("device '{device}' ({addr}): {source}")]
    Unreachable {
        device: String,
        addr: String,
        #[source]
        source: Box<RingError>,
    },
    /// A node's answer is no profile.
    #[error("device '{device}' ({addr}): unreadable profile: {source}")]
    BadProfile {
        device: String,
        addr: String,
        #[source]
        source: serde_json::Error,
    },
    /// A node to be profiled that has no address (none given, none started, none found).
    #[error("device '{device}': no address")]
    NoAddress { device: String },
    /// Profiles must be measured, but the caller gave no backend or transport to do it.
    #[error("profiling the devices needs the head's backend and a transport")]
    NoBackend,
    /// The model's shapes, as the planner reads them.
    #[error(transparent)]
    ModelProfile(#[from] ModelProfileError),
    /// The solver plugin Halda needs.
    #[error(transparent)]
    Solver(#[from] PluginError),
    /// Halda (or the manifest's scheduler) found no plan.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The windows the plan (or `policy.windows`) gives do not cover the model.
    #[error(transparent)]
    Windows(#[from] WindowError),
    #[error("{}: the plan gives no device any layer", manifest.display())]
    NoLayers { manifest: PathBuf },
    /// A local node could not be started (or its state not be kept).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("device '{device}': the local node failed to start ({status}): {why}")]
    NodeFailed {
        device: String,
        status: std::process::ExitStatus,
        why: String,
    },
    #[error("device '{device}': the local node did not start within 60 s")]
    NodeTimeout { device: String },
    /// A ring device, by its manifest name, was lost or refused the ring's setup.
    #[error("device '{device}' ({addr}) is gone: {reason}")]
    DeviceLost {
        device: String,
        addr: String,
        reason: String,
    },
    #[error("device '{device}' ({addr}) refused the setup: {reason}")]
    Refused {
        device: String,
        addr: String,
        reason: String,
    },
    /// Any other failure of the ring (connecting, its setup, a transport).
    #[error(transparent)]
    Ring(#[from] RingError),
}
