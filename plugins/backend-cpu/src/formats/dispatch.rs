//! Run-time kernel selection: the one place that decides which instruction set the format
//! kernels use.
//!
//! The CPU's features are detected once (and `PRIMA_CPU_KERNELS=scalar|avx2|avx512|neon|neon-dotprod` may ask
//! for a lower level, for tests and ablation); [`kernels`] then hands out the table of the
//! selected [`KernelLevel`], falling back to [`super::scalar`] for anything a level does
//! not accelerate. Every level returns the same bits as the scalar kernels: integer block
//! sums are exact and the float accumulation follows the scalar order (see `formats::x86`),
//! so the level changes speed, never results.
//!
//! Not for: AMX. Some hosts advertise it yet kill the process with SIGILL, so it is never
//! probed.

use super::{float, scalar, AttentionF16, AxpyF16Fn, FormatKernels};
use prima_abi::GgmlType;
use std::sync::OnceLock;

/// The environment variable that caps the kernel level.
pub const ENV_VAR: &str = "PRIMA_CPU_KERNELS";

/// An instruction-set level the format kernels are compiled for, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum KernelLevel {
    /// The portable reference kernels.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI, on top of everything AVX2 has.
    Avx512,
    /// aarch64 NEON (Advanced SIMD, part of the aarch64 baseline).
    Neon,
    /// aarch64 NEON with the dot-product extension (`sdot`).
    NeonDotprod,
}

impl KernelLevel {
    pub const ALL: [KernelLevel; 5] = [
        KernelLevel::Scalar,
        KernelLevel::Avx2,
        KernelLevel::Avx512,
        KernelLevel::Neon,
        KernelLevel::NeonDotprod,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelLevel::Scalar => "scalar",
            KernelLevel::Avx2 => "avx2",
            KernelLevel::Avx512 => "avx512",
            KernelLevel::Neon => "neon",
            KernelLevel::NeonDotprod => "neon-dotprod",
        }
    }

    pub fn from_name(name: &str) -> Option<KernelLevel> {
        KernelLevel::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether this CPU can run the level's kernels.
    pub fn is_available(self) -> bool {
        match self {
            KernelLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx512 => {
                KernelLevel::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            KernelLevel::Avx2 | KernelLevel::Avx512 => false,
            #[cfg(target_arch = "aarch64")]
            KernelLevel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            KernelLevel::NeonDotprod => {
                KernelLevel::Neon.is_available()
                    && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(not(target_arch = "aarch64"))]
            KernelLevel::Neon | KernelLevel::NeonDotprod => false,
        }
    }

    /// The kernels of weight type `t` at this level, or `None` when `t` is not a weight
    /// type or this CPU cannot run the level.
    pub fn kernels(self, t: GgmlType) -> Option<FormatKernels> {
        if !self.is_available() {
            return None;
        }
        let base = scalar::kernels(t)?;
        Some(match self {
            KernelLevel::Scalar => base,
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx2 => super::x86::levels::avx2(base),
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx512 => super::x86::levels::avx512(super::x86::levels::avx2(base)),
            #[cfg(not(target_arch = "x86_64"))]
            KernelLevel::Avx2 | KernelLevel::Avx512 => base,
            #[cfg(target_arch = "aarch64")]
            KernelLevel::Neon => super::arm::neon::overlay(base, false),
            // Only reached on a CPU with the extension: `is_available` checked it above.
            #[cfg(target_arch = "aarch64")]
            KernelLevel::NeonDotprod => super::arm::neon::overlay(base, true),
            #[cfg(not(target_arch = "aarch64"))]
            KernelLevel::Neon | KernelLevel::NeonDotprod => base,
        })
    }
}

impl KernelLevel {
    /// The F16 `axpy` of this level (attention's weighting of V rows), or `None` when this
    /// CPU cannot run the level.
    pub fn axpy_f16(self) -> Option<AxpyF16Fn> {
        if !self.is_available() {
            return None;
        }
        Some(match self {
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx2 | KernelLevel::Avx512 => super::x86::attention::axpy_f16,
            _ => float::axpy_f16,
        })
    }
}

impl KernelLevel {
    /// Attention's several-head F16 products at this level, or `None` when this CPU cannot
    /// run the level.
    pub fn attention_f16(self) -> Option<AttentionF16> {
        if !self.is_available() {
            return None;
        }
        Some(match self {
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx2 => super::x86::attention::AVX2,
            #[cfg(target_arch = "x86_64")]
            KernelLevel::Avx512 => super::x86::attention::AVX512,
            _ => AttentionF16 {
                dots: float::dots_f16,
                axpys: float::axpys_f16,
            },
        })
    }
}

/// Every level this CPU can run, lowest first (tests run them all).
pub fn available_levels() -> Vec<KernelLevel> {
    KernelLevel::ALL
        .into_iter()
        .filter(|l| l.is_available())
        .collect()
}

/// The level in use and how it was chosen.
#[derive(Clone, Debug)]
pub struct Selection {
    pub level: KernelLevel,
    /// Set when `PRIMA_CPU_KERNELS` was given but could not be honoured as written.
    pub note: Option<String>,
}

/// Detects once, on first use: the best available level, capped by `PRIMA_CPU_KERNELS`.
pub fn selection() -> &'static Selection {
    static SELECTION: OnceLock<Selection> = OnceLock::new();
    SELECTION.get_or_init(|| select(std::env::var(ENV_VAR).ok().as_deref()))
}

/// The choice for a given `PRIMA_CPU_KERNELS` value (`None`: unset).
pub fn select(requested: Option<&str>) -> Selection {
    let best = available_levels()
        .into_iter()
        .max()
        .unwrap_or(KernelLevel::Scalar);
    let Some(req) = requested.filter(|r| !r.trim().is_empty()) else {
        return Selection {
            level: best,
            note: None,
        };
    };
    match KernelLevel::from_name(req) {
        Some(l) if l.is_available() => Selection {
            level: l,
            note: None,
        },
        Some(l) => Selection {
            level: best,
            note: Some(format!(
                "{ENV_VAR}={req}: this CPU cannot run {} kernels, using {}",
                l.name(),
                best.name()
            )),
        },
        None => Selection {
            level: best,
            note: Some(format!(
                "{ENV_VAR}={req} is not one of scalar, avx2, avx512, neon, neon-dotprod; using {}",
                best.name()
            )),
        },
    }
}

/// The selected level's name, e.g. `"avx512"` (for `describe()`).
pub fn kernel_level_name() -> &'static str {
    selection().level.name()
}

/// The selected level's kernels for weight type `t`; has the signature of
/// `ops::matmul::KernelLookup`.
pub fn kernels(t: GgmlType) -> Option<FormatKernels> {
    selection().level.kernels(t)
}

/// The selected level's F16 `axpy`.
pub fn axpy_f16() -> AxpyF16Fn {
    selection()
        .level
        .axpy_f16()
        .unwrap_or(float::axpy_f16 as AxpyF16Fn)
}

/// The selected level's several-head attention products.
pub fn attention_f16() -> AttentionF16 {
    selection().level.attention_f16().unwrap_or(AttentionF16 {
        dots: float::dots_f16,
        axpys: float::axpys_f16,
    })
}
