//! The WGSL kernel sources and how one pipeline's shader is assembled from them.
//!
//! Every pipeline is its own small shader with one entry point, `main`: the shared
//! functions (`common.wgsl`), for the row kernels the weight binding and byte readers
//! (`weights.wgsl`) and the format family's decoders (`formats_*.wgsl`), then a template
//! (`get_rows.wgsl`, `matmul_*.wgsl`, …) whose `{NAME}`-style holes name the format or
//! operation. One entry point per shader keeps each pipeline's bindings exactly those its
//! template declares (the pipelines use wgpu's automatic layouts). Nothing here talks to a
//! GPU: [`source`] is plain text that `crate::device` compiles.

use crate::formats::{format_of_kernel, Activation, Family, Format};

mod legacy_rows;

use legacy_rows::{fill_legacy_rows, legacy_rows_kernel};
pub use legacy_rows::{
    unrolled_offsets, LegacyRows, ACT_UNIFORM_BYTES, LEGACY_ROWS_TOKENS, MAX_SEGMENTS,
    MAX_UNROLLED_BLOCKS, ROPE_HEAD, TEXEL_FORMATS,
};

const COMMON: &str = include_str!("common.wgsl");
const WEIGHTS: &str = include_str!("weights.wgsl");

fn family_source(f: Family) -> &'static str {
    match f {
        Family::Float => include_str!("formats_float.wgsl"),
        Family::Legacy => include_str!("formats_legacy.wgsl"),
        Family::K => include_str!("formats_k.wgsl"),
    }
}

/// Workgroup size of the 1-D kernels (the `64u` in their `flat_id` calls).
pub const WG: u32 = 64;
/// Tokens per matmul workgroup: `TOK` in matmul_quant.wgsl, 4 in matmul_float.wgsl.
pub const MATMUL_TOKENS_QUANT: u32 = 8;
pub const MATMUL_TOKENS_FLOAT: u32 = 4;
/// Invocations per attention workgroup: 64 on GPUs, 16 in `attention_narrow` for CPU
/// adapters, where each barrier switches between a workgroup's SIMD vectors of 8.
pub fn attention_workgroup(name: &str) -> u32 {
    if name == "attention_narrow" {
        16
    } else {
        64
    }
}

/// The largest head size attention takes (`qs` in attention.wgsl).
pub const ATT_MAX_HEAD_DIM: u32 = 512;

/// The WGSL of pipeline `name`, or `None` if there is no such kernel. `f64`: whether the
/// device has SHADER_F64 (RMS norm's sum and attention's exp and total use it if so).
pub fn source(name: &str, f64: bool) -> Option<String> {
    let mut src = String::with_capacity(16 * 1024);
    src.push_str(COMMON);
    let sum_t = if f64 { "f64" } else { "f32" };
    if let Some(kernel) = name.strip_prefix("get_rows_") {
        push_format(&mut src, format_of_kernel(kernel)?);
        src.push_str(&fill(
            include_str!("get_rows.wgsl"),
            format_of_kernel(kernel)?,
        ));
    } else if let Some(kernel) = name.strip_prefix("matmul_") {
        let f = format_of_kernel(kernel)?;
        push_format(&mut src, f);
        let template = match f.activation {
            Activation::Float => include_str!("matmul_float.wgsl"),
            _ => include_str!("matmul_quant.wgsl"),
        };
        src.push_str(&fill(template, f));
    } else if let Some((variant, kernel)) = legacy_rows_kernel(name) {
        let f = format_of_kernel(kernel)?;
        if f.family != Family::Legacy {
            return None;
        }
        push_format(&mut src, f);
        src.push_str(&fill_legacy_rows(f, variant, sum_t));
    } else if let Some(kernel) = name.strip_prefix("rowmatmul_") {
        let f = format_of_kernel(kernel)?;
        push_format(&mut src, f);
        let template = match f.activation {
            Activation::Float => include_str!("matmul_float_rows.wgsl"),
            _ => include_str!("matmul_quant_rows.wgsl"),
        };
        src.push_str(&fill(template, f));
    } else if let Some((kind, wg)) = name
        .strip_prefix("quantize_")
        .map(|k| (k, WG))
        .or_else(|| Some((name.strip_prefix("narrow_quantize_")?, QUANTIZE_NARROW_WG)))
    {
        let (swiglu, kind) = match kind.strip_prefix("swiglu_") {
            Some(k) => (true, k),
            None => (false, kind),
        };
        let mut body = match kind {
            "q8_0" => "quantize_32(blk, x0, false);",
            "q8_1" => "quantize_32(blk, x0, true);",
            "q8_k" if !swiglu => "quantize_256(blk, x0);",
            _ => return None,
        }
        .to_string();
        let block = if kind == "q8_k" { 256 } else { 32 };
        body.insert_str(0, &format!("let x0 = P.x_off + blk * {block}u;\n    "));
        let (access, up) = if swiglu {
            body.insert_str(
                0,
                "for (var i = 0u; i < 32u; i++) {\n        \
                 let x = P.x_off + blk * 32u + i;\n        \
                 X[x] = op_swiglu(X[x], UP[P.up_off + blk * 32u + i]);\n    }\n    ",
            );
            (
                "read_write",
                "@group(0) @binding(3) var<storage, read> UP: array<f32>;",
            )
        } else {
            ("read", "")
        };
        src.push_str(include_str!("quantize_blocks.wgsl"));
        src.push_str(
            &include_str!("quantize.wgsl")
                .replace("{KIND}", kind)
                .replace("{X_ACCESS}", access)
                .replace("{UP_BINDING}", up)
                .replace("{BODY}", &body)
                .replace("{QWG}", &wg.to_string()),
        );
    } else if let Some(rest) = name.strip_suffix("rms_norm").or_else(|| {
        ["_q8_0", "_q8_1"]
            .iter()
            .find_map(|q| name.strip_suffix(q)?.strip_suffix("rms_norm"))
    }) {
        let (add, wg) = match rest {
            "" => (false, WG),
            "add_" => (true, WG),
            "narrow_" => (false, NORM_NARROW_WG),
            "narrow_add_" => (true, NORM_NARROW_WG),
            _ => return None,
        };
        src.push_str(&rms_norm_source(add, name.strip_prefix(rest)?, sum_t, wg));
    } else {
        match name {
            "add" | "add_bias" | "swiglu" | "geglu" => {
                src.push_str(&include_str!("binary.wgsl").replace("{NAME}", name))
            }
            "scale" => src.push_str(include_str!("scale.wgsl")),
            "rope" => src.push_str(
                &include_str!("rope.wgsl")
                    .replace("{X2_BINDING}", "")
                    .replace("{SECOND}", ""),
            ),
            "rope_pair" => src.push_str(
                &include_str!("rope.wgsl")
                    .replace(
                        "{X2_BINDING}",
                        "@group(0) @binding(3) var<storage, read_write> X2: array<f32>;",
                    )
                    .replace("{SECOND}", ROPE_SECOND),
            ),
            "rope_pair_store" => src.push_str(
                &include_str!("rope.wgsl")
                    .replace("{X2_BINDING}", ROPE_STORE_BINDINGS)
                    .replace("{SECOND}", ROPE_SECOND_STORE),
            ),
            "store_f16" => src.push_str(include_str!("store_f16.wgsl")),
            "attention"
            | "attention_narrow"
            | "attention_q8_0"
            | "attention_q8_1"
            | "attention_narrow_q8_0"
            | "attention_narrow_q8_1"
            | "attention_narrow_d64"
            | "attention_narrow_d64_q8_0"
            | "attention_narrow_d64_q8_1" => {
                let (base, quant) = match name.rsplit_once("_q8_") {
                    Some((base, kind)) => (base, Some(kind == "1")),
                    None => (name, None),
                };
                let (base, d64) = match base.strip_suffix("_d64") {
                    Some(b) => (b, true),
                    None => (base, false),
                };
                if quant.is_some() {
                    src.push_str(include_str!("quantize_blocks.wgsl"));
                }
                let exp = if f64 {
                    include_str!("exp_f64.wgsl")
                } else {
                    include_str!("exp_f32.wgsl")
                };
                src.push_str(
                    &include_str!("attention.wgsl")
                        .replace("{TOTAL_T}", sum_t)
                        .replace("{EXP_FN}", exp)
                        .replace("{WG}", &attention_workgroup(base).to_string())
                        .replace(
                            "{QUANT_DECLS}",
                            if quant.is_some() { ATT_QUANT_DECLS } else { "" },
                        )
                        .replace(
                            "{QUANT_KEEP4}",
                            if quant.is_some() { ATT_QUANT_KEEP4 } else { "" },
                        )
                        .replace(
                            "{QUANT_KEEP1}",
                            if quant.is_some() { ATT_QUANT_KEEP1 } else { "" },
                        )
                        .replace(
                            "{QUANTIZE}",
                            &match quant {
                                Some(with_s) => {
                                    ATT_QUANTIZE.replace("{WITH_S}", &with_s.to_string())
                                }
                                None => String::new(),
                            },
                        ),
                );
                if d64 {
                    src = attention_d64(src)?;
                }
            }
            _ => return None,
        }
    }
    Some(src)
}

/// Invocations (blocks) per workgroup of the `narrow_quantize_*` kernels, for CPU adapters:
/// one SIMD vector of llvmpipe's, so that a layer's few blocks make several workgroups,
/// which its threads share, rather than one.
pub const QUANTIZE_NARROW_WG: u32 = 8;

/// Invocations per workgroup of the `narrow_*rms_norm*` kernels, for CPU adapters: one of
/// llvmpipe's SIMD vectors, which then runs the serial sum once rather than once per
/// vector of a workgroup of [`WG`] (each masked).
pub const NORM_NARROW_WG: u32 = 8;

/// rms_norm.wgsl for `name` (`rms_norm`, `rms_norm_q8_0`, `rms_norm_q8_1`), with the
/// residual added first if `add`, `wg` invocations a workgroup.
fn rms_norm_source(add: bool, name: &str, sum_t: &str, wg: u32) -> String {
    let quant = match name {
        "rms_norm" => None,
        "rms_norm_q8_0" => Some(false),
        "rms_norm_q8_1" => Some(true),
        _ => unreachable!("rms_norm variants are matched by name"),
    };
    let mut src = String::new();
    if quant.is_some() {
        src.push_str(include_str!("quantize_blocks.wgsl"));
    }
    let (access, load, barrier) = if add {
        (
            "read_write",
            "            let xi = X[x0 + i] + OUT[P.h_off + row * P.n + i];\n            X[x0 + i] = xi;",
            "    storageBarrier();\n    workgroupBarrier();",
        )
    } else {
        (
            "read",
            "            let xi = X[x0 + i];",
            "    workgroupBarrier();",
        )
    };
    let (bindings, quantize) = match quant {
        Some(with_s) => (
            "@group(0) @binding(5) var<storage, read_write> A: array<u32>;".to_string(),
            format!(
                "    let nb = P.n / 32u;\n    for (var b = lid; b < nb; b += {{NWG}}u) {{\n        \
                 quantize_32(row * nb + b, 32u * b, {with_s});\n    }}"
            ),
        ),
        None => (String::new(), String::new()),
    };
    src.push_str(
        &include_str!("rms_norm.wgsl")
            .replace("{SUM_T}", sum_t)
            .replace("{X_ACCESS}", access)
            .replace("{LOAD}", load)
            .replace("{BARRIER}", barrier)
            .replace("{EXTRA_BINDINGS}", &bindings)
            .replace("{QUANTIZE}", &quantize)
            .replace("{NWG}", &wg.to_string()),
    );
    src
}

const ROPE_STORE_BINDINGS: &str = "@group(0) @binding(3) var<storage, read_write> X2: array<f32>;
@group(0) @binding(4) var<storage, read_write> KC: array<u32>;
@group(0) @binding(5) var<storage, read> VS: array<f32>;
@group(0) @binding(6) var<storage, read_write> VC: array<u32>;";

/// `rope_pair_store`'s turn of X2 into the cache, then VS's store (see rope.wgsl).
const ROPE_SECOND_STORE: &str = "    else {
        let half = P.n_rot / 2u;
        var per = half;
        if (P.neox != 0u) {
            per = half / 2u;
        }
        let n2 = P.n_tokens * P.n_head2 * per;
        let u = idx - n1;
        if (u < n2) {
            let th = u / per;
            let c = (th / P.n_head2) * half;
            let base = th * P.head_dim;
            if (P.neox != 0u) {
                let p0 = 2u * (u % per);
                let e0 = vec3<u32>(base + p0, base + p0 + half, c + p0);
                let e1 = vec3<u32>(base + p0 + 1u, base + p0 + 1u + half, c + p0 + 1u);
                let r0 = turn(X2[P.x2_off + e0.x], X2[P.x2_off + e0.y], e0);
                let r1 = turn(X2[P.x2_off + e1.x], X2[P.x2_off + e1.y], e1);
                X2[P.x2_off + e0.x] = r0.x;
                X2[P.x2_off + e0.y] = r0.y;
                X2[P.x2_off + e1.x] = r1.x;
                X2[P.x2_off + e1.y] = r1.y;
                KC[P.kc_off + e0.x / 2u] = f16_bits(r0.x) | (f16_bits(r1.x) << 16u);
                KC[P.kc_off + e0.y / 2u] = f16_bits(r0.y) | (f16_bits(r1.y) << 16u);
            } else {
                let i = u % per;
                let e = vec3<u32>(base + 2u * i, base + 2u * i + 1u, c + i);
                let r = turn(X2[P.x2_off + e.x], X2[P.x2_off + e.y], e);
                X2[P.x2_off + e.x] = r.x;
                X2[P.x2_off + e.y] = r.y;
                KC[P.kc_off + e.x / 2u] = f16_bits(r.x) | (f16_bits(r.y) << 16u);
            }
        } else if (u - n2 < P.v_words) {
            let j = u - n2;
            let s = P.v_src + 2u * j;
            VC[P.vc_off + j] = f16_bits(VS[s]) | (f16_bits(VS[s + 1u]) << 16u);
        }
    }";

/// `attention_narrow_d64*`: heads of 64 (the host checks), q in registers for the q·k loop
/// rather than read from workgroup memory (lane by lane on a CPU adapter) for every key; the
/// same products and sums in the same order.
fn attention_d64(src: String) -> Option<String> {
    let loop_at = "    for (var i = lid; i < n; i += WG) {\n        let kb";
    let mut q = String::new();
    for c in 0..16 {
        q.push_str(&format!("    let qv{c} = q4({}u);\n", 4 * c));
    }
    let even_from = "        if ((P.dk & 1u) == 0u) {";
    let even_to = "        // The 16 folded by halving: 8, 4, 2, 1.";
    let (head, rest) = src.split_once(even_from)?;
    let (_, tail) = rest.split_once(even_to)?;
    let mut dot = String::from("        let w = kb >> 1u;\n");
    for c in 0..4 {
        for a in 0..4 {
            let at = 8 * c + 2 * a;
            dot.push_str(&format!(
                "        a{a} = a{a} + qv{} * vec4<f32>(unpack2x16float(K[w + {at}u]), \
                 unpack2x16float(K[w + {}u]));\n",
                4 * c + a,
                at + 1
            ));
        }
    }
    let joined = format!("{head}{dot}{even_to}{tail}");
    joined
        .contains(loop_at)
        .then(|| joined.replacen(loop_at, &format!("{q}{loop_at}"), 1))
}

/// attention*_q8_*: each head's output kept in workgroup memory, then quantized a block of
/// 32 an invocation (quantize_blocks.wgsl) as the quantize kernel would from OUT.
const ATT_QUANT_DECLS: &str = "var<workgroup> kept: array<f32, 512>;
@group(0) @binding(6) var<storage, read_write> A: array<u32>;
fn qin(i: u32) -> f32 {
    return kept[i];
}";
const ATT_QUANT_KEEP4: &str = "        kept[4u * j] = o0;
        kept[4u * j + 1u] = o1;
        kept[4u * j + 2u] = o2;
        kept[4u * j + 3u] = o3;";
const ATT_QUANT_KEEP1: &str = "        kept[d] = o;";
const ATT_QUANTIZE: &str = "    workgroupBarrier();
    let per_head = P.dv / 32u;
    for (var b = lid; b < per_head; b += WG) {
        quantize_32((t * P.n_head + h) * per_head + b, 32u * b, {WITH_S});
    }";

/// `rope_pair`'s turn of X2, after X's invocations.
const ROPE_SECOND: &str = "    else if (idx - n1 < P.n_tokens * P.n_head2 * (P.n_rot / 2u)) {
        let e = pair_of(idx - n1, P.n_head2);
        let r = turn(X2[P.x2_off + e.x], X2[P.x2_off + e.y], e);
        X2[P.x2_off + e.x] = r.x;
        X2[P.x2_off + e.y] = r.y;
    }";

fn push_format(src: &mut String, f: &Format) {
    src.push_str(WEIGHTS);
    src.push_str(family_source(f.family));
}

fn fill(template: &str, f: &Format) -> String {
    template
        .replace("{NAME}", f.kernel)
        .replace("{QK}", &f.qk().to_string())
        .replace("{BYTES}", &f.block_bytes().to_string())
}

/// Every pipeline the backend can create (the tests compile them all).
pub fn all_kernels() -> Vec<String> {
    let mut v: Vec<String> = crate::formats::FORMATS
        .iter()
        .flat_map(|f| {
            [
                format!("get_rows_{}", f.kernel),
                format!("matmul_{}", f.kernel),
                format!("rowmatmul_{}", f.kernel),
            ]
        })
        .collect();
    for f in crate::formats::FORMATS
        .iter()
        .filter(|f| f.family == Family::Legacy)
    {
        for tokens in LEGACY_ROWS_TOKENS {
            for uniform in [false, true] {
                for texels in [false, true] {
                    if texels && !TEXEL_FORMATS.contains(&f.kernel) {
                        continue;
                    }
                    let variant = LegacyRows {
                        tokens,
                        uniform,
                        texels,
                        unrolled: 0,
                        segments: 1,
                        swiglu: None,
                        rope: false,
                        norm: None,
                    };
                    v.push(variant.name(f.kernel));
                    if tokens == 1 {
                        for unrolled in [1, 18, MAX_UNROLLED_BLOCKS] {
                            let segments = if texels { MAX_SEGMENTS } else { 1 };
                            for segments in 1..=segments {
                                v.push(
                                    LegacyRows {
                                        unrolled,
                                        segments,
                                        ..variant
                                    }
                                    .name(f.kernel),
                                );
                            }
                            if texels && uniform {
                                v.push(
                                    LegacyRows {
                                        unrolled,
                                        segments: 3,
                                        rope: true,
                                        ..variant
                                    }
                                    .name(f.kernel),
                                );
                                for with_s in [false, true] {
                                    v.push(
                                        LegacyRows {
                                            unrolled,
                                            segments: 2,
                                            swiglu: Some(with_s),
                                            ..variant
                                        }
                                        .name(f.kernel),
                                    );
                                    v.push(
                                        LegacyRows {
                                            unrolled,
                                            norm: Some(with_s),
                                            ..variant
                                        }
                                        .name(f.kernel),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for k in [
        "quantize_q8_0",
        "quantize_q8_1",
        "quantize_q8_k",
        "quantize_swiglu_q8_0",
        "quantize_swiglu_q8_1",
        "narrow_quantize_q8_0",
        "narrow_quantize_q8_1",
        "narrow_quantize_q8_k",
        "narrow_quantize_swiglu_q8_0",
        "narrow_quantize_swiglu_q8_1",
        "add_rms_norm",
        "rms_norm_q8_0",
        "rms_norm_q8_1",
        "add_rms_norm_q8_0",
        "add_rms_norm_q8_1",
        "narrow_rms_norm",
        "narrow_add_rms_norm",
        "narrow_rms_norm_q8_0",
        "narrow_rms_norm_q8_1",
        "narrow_add_rms_norm_q8_0",
        "narrow_add_rms_norm_q8_1",
        "add",
        "add_bias",
        "swiglu",
        "geglu",
        "scale",
        "rms_norm",
        "rope",
        "rope_pair",
        "rope_pair_store",
        "store_f16",
        "attention",
        "attention_narrow",
        "attention_q8_0",
        "attention_q8_1",
        "attention_narrow_q8_0",
        "attention_narrow_q8_1",
        "attention_narrow_d64",
        "attention_narrow_d64_q8_0",
        "attention_narrow_d64_q8_1",
    ] {
        v.push(k.to_string());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every source parses and validates as WGSL (naga, no GPU needed), with and
    /// without f64.
    #[test]
    fn every_kernel_is_valid_wgsl() {
        for f64 in [false, true] {
            for name in all_kernels() {
                let src = source(&name, f64).unwrap_or_else(|| panic!("{name}: no source"));
                for hole in [
                    "{NAME}",
                    "{QK}",
                    "{BYTES}",
                    "{SUM_T}",
                    "{TOTAL_T}",
                    "{EXP_FN}",
                    "{KIND}",
                    "{BODY}",
                    "{TOK}",
                    "{DECLARE}",
                    "{ACCUMULATE}",
                    "{STORE}",
                    "{ACT}",
                    "{ACT_VEC4S}",
                    "{BLOCK}",
                    "{BLOCKS}",
                    "{X_ACCESS}",
                    "{UP_BINDING}",
                    "{LOAD}",
                    "{BARRIER}",
                    "{EXTRA_BINDINGS}",
                    "{QUANTIZE}",
                    "{WG}",
                    "{X2_BINDING}",
                    "{SECOND}",
                ] {
                    assert!(!src.contains(hole), "{name}: {hole} left unfilled");
                }
                let module = naga::front::wgsl::parse_str(&src)
                    .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(&src)));
                // unpack2x16float needs SHADER_FLOAT16_IN_FLOAT32, which wgpu grants
                // wherever the downlevel flag SHADER_F16_IN_F32 holds (every native API).
                let mut caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
                if f64 {
                    caps |= naga::valid::Capabilities::FLOAT64;
                }
                naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps)
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{name} (f64 {f64}): {}", e.emit_to_string(&src)));
            }
        }
        assert!(source("matmul_q8_k", false).is_none());
        assert!(source("nothing", false).is_none());
        assert!(source("quantize_swiglu_q8_k", false).is_none());
        assert!(source("mul_rms_norm", false).is_none());
        assert!(source("rowmatmul_tok1_q4_k", false).is_none());
        assert!(source("rowmatmul_tok3_q4_1", false).is_none());
        assert!(source("rowmatmul_tok1_tex_q4_0", false).is_none());
        assert!(source("rowmatmul_tok8_nb18_q4_1", false).is_none());
        assert!(source("rowmatmul_tok1_nb65_q4_1", false).is_none());
    }

    #[test]
    fn every_format_has_its_functions() {
        for f in crate::formats::FORMATS {
            let fam = family_source(f.family);
            assert!(
                fam.contains(&format!("fn deq_{}(", f.kernel)),
                "{}",
                f.kernel
            );
            match f.activation {
                Activation::Float => {
                    assert!(fam.contains(&format!("fn elem_{}(", f.kernel)));
                    assert!(fam.contains(&format!("fn act_{}(", f.kernel)));
                }
                _ => {
                    for p in ["dec", "part", "comb"] {
                        assert!(
                            fam.contains(&format!("fn {p}_{}(", f.kernel)),
                            "{p} {}",
                            f.kernel
                        );
                    }
                }
            }
        }
    }
}
