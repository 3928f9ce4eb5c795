//! The conformance suite every GPU plugin passes against the CPU backend, the oracle
//! (feature `conformance`; each plugin's tests call it with its own backend):
//!
//! - [`ops`]: each weight format's get_rows and matmul, every element-wise operation,
//!   RoPE variants, attention variants (GQA, sliding window, soft-capping, truncation);
//! - [`models`]: generated Llama-shaped models and real ones, logits and greedy tokens
//!   over a prompt and fed and free-running steps;
//! - [`tee`]: a model's forward pass with every operation on both backends, per kind of
//!   operation.
//!
//! Comparisons are exact (0) for a [`Target`] that claims the CPU's bits, else relative to
//! the magnitudes compared ([`LOOSE`]; also results of F32 matmuls on a target whose
//! multiply-adds are not fused as the CPU's F32 dot's are, see [`f32_matmul_fuses`]); greedy tokens must agree wherever the CPU's top-2
//! gap exceeds [`GAP`], as the golden fixtures require of Prima against llama.cpp.

pub mod models;
pub mod ops;
pub mod tee;

use std::path::{Path, PathBuf};

use abi_stable::std_types::{RSlice, RSliceMut};
use half::{bf16, f16};
use prima_abi::backend::{BackendBox, BackendConfig, TensorView};
use prima_abi::GgmlType;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The relative tolerance of a backend that does not claim the CPU's bits (a driver may
/// contract multiply-adds or reassociate where the kernel language cannot forbid it).
pub const LOOSE: f32 = 1e-4;

/// The top-2 gap above which both backends must pick the same token.
pub const GAP: f32 = 1.0;

/// The GPU backend under test and how closely it must follow the CPU.
pub struct Target {
    pub backend: BackendBox,
    /// Results must equal the CPU's bit for bit (measured so on this device and driver).
    pub exact: bool,
    /// Whether the backend's F32 matmul fuses each multiply-add as the CPU's canonical F32
    /// dot does ([`f32_matmul_fuses`]); where it does not, F32 matmuls and what goes
    /// through them are held to [`LOOSE`] even on an exact target.
    pub fused_f32: bool,
}

impl Target {
    /// The tolerance of a comparison: 0 where [`Self::exact`], else [`LOOSE`] × `scale`.
    pub fn tol(&self, scale: f32) -> f32 {
        if self.exact {
            0.0
        } else {
            LOOSE * scale.max(1.0)
        }
    }

    /// The tolerance of a comparison of F32 matmul results: [`Self::tol`] where the F32
    /// multiply-adds are fused as the CPU's, else [`LOOSE`] × `scale`.
    pub fn tol_f32(&self, scale: f32) -> f32 {
        if self.fused_f32 {
            self.tol(scale)
        } else {
            LOOSE * scale.max(1.0)
        }
    }
}

/// Whether `backend`'s F32 matmul rounds each multiply-add once, as the CPU's canonical F32
/// dot (`formats/float.rs` `DOT_LANES`) does: one 32-element row and token where lane 0
/// adds `x·x` (`x = 1 + 2^-12`, `x² = 1 + 2^-11 + 2^-24`) to `−1`. Fused that is exact,
/// `2^-11 + 2^-24`; a product rounded first (a tie, to even) leaves `2^-11`. WGSL's `fma`
/// may be either: Mesa's lavapipe splits it into a multiply and an add.
pub fn f32_matmul_fuses(backend: &BackendBox) -> bool {
    let x = 1.0 + 2f32.powi(-12);
    let (mut w, mut a) = ([0f32; 32], [0f32; 32]);
    (w[0], a[0], w[16], a[16]) = (1.0, -1.0, x, x);
    let w: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = [0f32];
    prima_abi::on_host::OnHost(backend)
        .matmul(
            view(&w, GgmlType::F32, 32, 1),
            RSlice::from_slice(&a),
            1,
            RSliceMut::from_mut_slice(&mut out),
        )
        .unwrap();
    out[0] == 2f32.powi(-11) + 2f32.powi(-24)
}

/// The CPU backend, loaded as a plugin (linking its rlib too would clash with a GPU
/// plugin's exported symbols): from $PRIMA_PLUGIN_DIR, else beside the test binary.
pub fn cpu() -> BackendBox {
    prima_core::plugin::load_backend(Some("cpu"), BackendConfig { threads: 0 })
        .expect(
            "the CPU backend plugin (cargo build -p prima-backend-cpu, or set PRIMA_PLUGIN_DIR)",
        )
        .backend
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// (offset, value) of each f16 scale field in a block: chosen so a random block's weights
/// have mean ≈ 0 and standard deviation ≈ 0.03 (≈ 1/√1024), so activations stay in range
/// through a generated model's layers instead of growing chaotically.
pub fn scale_fields(ty: GgmlType) -> &'static [(usize, f32)] {
    match ty {
        GgmlType::Q4_0 => &[(0, 0.0068)],
        GgmlType::Q5_0 => &[(0, 0.0034)],
        GgmlType::Q8_0 => &[(0, 0.00042)],
        GgmlType::Q4_1 => &[(0, 0.0068), (2, -0.051)],
        GgmlType::Q5_1 => &[(0, 0.0034), (2, -0.053)],
        GgmlType::Q2K => &[(80, 0.004), (82, 0.006)],
        GgmlType::Q3K => &[(108, 0.00075)],
        GgmlType::Q4K => &[(0, 0.0002), (2, 0.0015)],
        GgmlType::Q5K => &[(0, 0.0001), (2, 0.00155)],
        GgmlType::Q6K => &[(208, 0.000023)],
        _ => &[],
    }
}

/// `rows` rows of `cols` random but valid elements of `ty`.
pub fn random_weight(rng: &mut ChaCha8Rng, ty: GgmlType, cols: usize, rows: usize) -> Vec<u8> {
    let n = cols * rows;
    let mut normal = || (rng.gen::<f32>() - 0.5) * 0.1;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| normal().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(normal()).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(normal()).to_le_bytes())
            .collect(),
        _ => {
            let bytes = ty.row_bytes(cols).unwrap() * rows;
            let mut data: Vec<u8> = (0..bytes).map(|_| rng.gen()).collect();
            for block in data.chunks_exact_mut(ty.block_bytes()) {
                let jitter = 0.75 + 0.5 * rng.gen::<f32>();
                for &(off, v) in scale_fields(ty) {
                    block[off..off + 2].copy_from_slice(&f16::from_f32(v * jitter).to_le_bytes());
                }
            }
            data
        }
    }
}

pub fn view(data: &[u8], ty: GgmlType, cols: usize, rows: usize) -> TensorView<'_> {
    TensorView {
        data: RSlice::from_slice(data),
        ggml_type: ty as u32,
        cols: cols as u64,
        rows: rows as u64,
    }
}

pub fn randn(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen::<f32>() * 2.0 - 1.0).collect()
}

pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::MIN),
            |(bi, bv), (i, &x)| if x > bv { (i, x) } else { (bi, bv) },
        )
        .0
}

pub fn top2_gap(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::MIN, f32::MIN);
    for &x in v {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

/// A model from the repository's `models/` (fetched by `cargo xtask setup`).
pub fn fetched(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// A derived test model (`cargo xtask test-models`): `$PRIMA_MODEL_DIR`, else
/// `~/.cache/prima/models`.
pub fn derived(name: &str) -> PathBuf {
    let dir = match std::env::var_os("PRIMA_MODEL_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/prima/models")
        }
    };
    dir.join(name)
}

/// `path` if the model is there, or `None` where it is absent and absence is allowed
/// (`PRIMA_REQUIRE_MODELS` unset).
pub fn model_path(path: PathBuf) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    if std::env::var_os("PRIMA_REQUIRE_MODELS").is_some() {
        panic!(
            "{} is missing (run `cargo xtask setup` / `cargo xtask test-models`)",
            path.display()
        );
    }
    eprintln!("note: skipping, {} is absent", path.display());
    None
}
