//! One-row kernels: a weight row against one activation row (`vec_dot`), or against
//! four (`vec_dot_x4`), and AVX-512's two-row tiles (`vec_dot_2x4`, `vec_dot_2x8`), which
//! `matmul` runs row by row for decode and for prompts without row panels.
//!
//! - `dot256`: AVX2, every weight format but the IQ4 ones; `dot512`: AVX-512 VNNI, the
//!   formats where it pays; `iq4`: IQ4_NL and IQ4_XS at both levels; `mxfp4`: MXFP4 (gpt-oss's experts) at both. `dot256` and
//!   `dot512` are not width twins (VNNI's `vpdpbusd` and two blocks a vector against
//!   `maddubs` + `madd`); what they share, the in-order block sums and the block-term
//!   helpers, is in `lanes256`.
//!
//! Not for: kernels that take many rows a step (`rows`, `panel`) or small batches (`few`);
//! choosing among these (`levels`).

pub(super) mod dot256;
pub(super) mod dot512;
pub(super) mod iq4;
pub(super) mod mxfp4;
