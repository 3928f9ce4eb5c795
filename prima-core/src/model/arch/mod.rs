//! The architectures Prima runs, as data: each file states how its family differs from
//! the shared decoder-only transformer in [`super::forward`].

mod llama;
mod qwen2;

/// A supported model architecture (`general.architecture` in GGUF).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
}

/// What distinguishes one architecture's decoder layer from another's.
#[derive(Debug, Clone, Copy)]
pub struct ArchSpec {
    /// The GGUF `general.architecture` value and key prefix.
    pub name: &'static str,
    /// NeoX rotates (i, i + n_rot/2); otherwise adjacent pairs (2i, 2i+1).
    pub rope_neox: bool,
    /// Whether Q, K and V projections carry bias vectors.
    pub qkv_bias: bool,
}

impl Architecture {
    pub const ALL: [Architecture; 2] = [Architecture::Llama, Architecture::Qwen2];

    pub fn from_name(name: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.spec().name == name)
    }

    pub fn spec(self) -> ArchSpec {
        match self {
            Architecture::Llama => llama::SPEC,
            Architecture::Qwen2 => qwen2::SPEC,
        }
    }

    pub fn supported_names() -> String {
        Architecture::ALL.map(|a| a.spec().name).join(", ")
    }
}
