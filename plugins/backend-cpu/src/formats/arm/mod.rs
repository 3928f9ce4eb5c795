//! aarch64 kernels. NEON (Advanced SIMD) is part of the aarch64 baseline, so this level
//! needs no detection beyond the architecture. Numerics as `formats::x86`: block integer
//! sums are exact, the float terms are added in block order with the scalar kernel's
//! operations, so every kernel returns exactly what the scalar kernel returns.

pub mod neon;
