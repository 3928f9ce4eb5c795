//! The legacy row kernels' sources (`rowmatmul_tok{T}[_ubo][_tex]…_<format>`, CPU
//! adapters): their names, and matmul_legacy_rows.wgsl filled in for a variant — a token
//! loop, or for a generated token an unrolled texel kernel, alone or with a fused epilogue
//! (several weights, RoPE and the KV store, SwiGLU, the next norm: crate::ops's fusion).

use super::{fill, MATMUL_TOKENS_QUANT, WG};
use crate::formats::{Activation, Format};

/// Tokens per workgroup of the legacy row kernels, `rowmatmul_tok{T}[_ubo]_<format>`: one
/// for a generated token, [`MATMUL_TOKENS_QUANT`] for a batch.
pub const LEGACY_ROWS_TOKENS: [u32; 2] = [1, MATMUL_TOKENS_QUANT];

/// Bytes of activations the legacy row kernels' uniform-buffer variant (`_ubo`) binds:
/// 64 KiB, lavapipe's largest uniform binding; the host checks the device's limit.
pub const ACT_UNIFORM_BYTES: u64 = 65536;

/// How a legacy row kernel reads its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegacyRows {
    /// Tokens per workgroup (one of [`LEGACY_ROWS_TOKENS`]).
    pub tokens: u32,
    /// Activations from a uniform buffer ([`ACT_UNIFORM_BYTES`] bound) or storage.
    pub uniform: bool,
    /// Weights from a texture (crate::texels) or their stored blocks.
    pub texels: bool,
    /// Blocks per row when the block loop is unrolled (one token only), 0 for a loop.
    /// llvmpipe loads a uniform buffer once for all lanes only at an offset it can see is
    /// the same in every lane, which a loop counter is not; unrolled, every activation
    /// offset is a constant.
    pub unrolled: u32,
    /// Weights whose rows follow one another in one texture, each with its own output
    /// (q, k, v; gate, up): 1 to [`MAX_SEGMENTS`], more than one only for an unrolled
    /// texel kernel. One dispatch rather than one each.
    pub segments: u32,
    /// A gate and up projection (2 segments of equal rows, a multiple of 32) whose
    /// SwiGLU the kernel applies and quantizes for the down projection: `Some(with_s)`,
    /// Q8_1 (true) or Q8_0 (`_swiglu_q8_1`, `_swiglu_q8_0`); uniform activations only.
    pub swiglu: Option<bool>,
    /// q, k and v projections (3 segments, heads of [`ROPE_HEAD`] rows, one token) whose
    /// q and k the kernel turns by RoPE, storing k and v into the F16 KV cache too
    /// (`_rope`): `rope_pair_store`'s work, a head a workgroup.
    pub rope: bool,
    /// One weight whose output h is then added to the residual stream x and RMS-normed
    /// into h, quantized for the next matmul: `Some(with_s)` (`_norm_q8_1`, `_norm_q8_0`).
    /// The last workgroup to finish (an atomic count; llvmpipe's atomics are sequentially
    /// consistent) does it as `narrow_add_rms_norm_q8_*` would.
    pub norm: Option<bool>,
}

/// The head size of the `_rope` kernels: one workgroup's rows.
pub const ROPE_HEAD: u32 = WG;

/// The most weights one unrolled texel kernel takes ([`LegacyRows::segments`]).
pub const MAX_SEGMENTS: u32 = 3;

/// The most blocks per row an unrolled kernel takes (its source grows with them).
pub const MAX_UNROLLED_BLOCKS: u32 = 64;

/// Formats the texture variant reads (crate::texels::Layout).
pub const TEXEL_FORMATS: [&str; 2] = ["q4_1", "q8_0"];

impl LegacyRows {
    /// The pipeline name: `rowmatmul_tok{T}[_ubo][_tex][_nb{B}[_seg{S}]]_<format>`.
    pub fn name(&self, kernel: &str) -> String {
        let ubo = if self.uniform { "_ubo" } else { "" };
        let tex = if self.texels { "_tex" } else { "" };
        let unrolled = match self.unrolled {
            0 => String::new(),
            n => format!("_nb{n}"),
        };
        let segments = match self.segments {
            0 | 1 => String::new(),
            n => format!("_seg{n}"),
        };
        let swiglu = match self.swiglu {
            None => "",
            Some(true) => "_swiglu_q8_1",
            Some(false) => "_swiglu_q8_0",
        };
        let rope = if self.rope { "_rope" } else { "" };
        let norm = match self.norm {
            None => "",
            Some(true) => "_norm_q8_1",
            Some(false) => "_norm_q8_0",
        };
        format!(
            "rowmatmul_tok{}{ubo}{tex}{unrolled}{segments}{swiglu}{rope}{norm}_{kernel}",
            self.tokens
        )
    }
}

/// Word offsets of one token's block scales and sums in the quantized activations of a row
/// of `nb` blocks, as an unrolled kernel has them built in (the host lays them out so).
pub fn unrolled_offsets(act: Activation, nb: u32) -> (u32, u32) {
    let d_off = nb * 8;
    match act {
        Activation::Q8_1 => (d_off, d_off + nb),
        _ => (d_off, d_off),
    }
}

/// The variant and format of a legacy row kernel's name.
pub(super) fn legacy_rows_kernel(name: &str) -> Option<(LegacyRows, &str)> {
    let (tok, rest) = name.strip_prefix("rowmatmul_tok")?.split_once('_')?;
    let tokens: u32 = tok.parse().ok()?;
    let (uniform, rest) = match rest.strip_prefix("ubo_") {
        Some(r) => (true, r),
        None => (false, rest),
    };
    let (texels, rest) = match rest.strip_prefix("tex_") {
        Some(k) => (true, k),
        None => (false, rest),
    };
    let (unrolled, kernel) = match rest.strip_prefix("nb") {
        Some(r) => {
            let (n, k) = r.split_once('_')?;
            (
                n.parse()
                    .ok()
                    .filter(|n| (1..=MAX_UNROLLED_BLOCKS).contains(n))?,
                k,
            )
        }
        None => (0, rest),
    };
    let (segments, kernel) = match kernel.strip_prefix("seg") {
        Some(r) => {
            let (n, k) = r.split_once('_')?;
            (
                n.parse().ok().filter(|n| (2..=MAX_SEGMENTS).contains(n))?,
                k,
            )
        }
        None => (1, kernel),
    };
    let (swiglu, kernel) = quantized_epilogue(kernel, "swiglu_q8_")?;
    let (rope, kernel) = match kernel.strip_prefix("rope_") {
        Some(k) => (true, k),
        None => (false, kernel),
    };
    let (norm, kernel) = quantized_epilogue(kernel, "norm_q8_")?;
    if (texels && !TEXEL_FORMATS.contains(&kernel))
        || (rope && segments != 3)
        || (norm.is_some() && (segments != 1 || unrolled == 0 || !texels || !uniform))
        || (unrolled > 0 && tokens != 1)
        || (segments > 1 && (unrolled == 0 || !texels))
        || (swiglu.is_some() && (segments != 2 || !uniform))
    {
        return None;
    }
    let v = LegacyRows {
        tokens,
        uniform,
        texels,
        unrolled,
        segments,
        swiglu,
        rope,
        norm,
    };
    LEGACY_ROWS_TOKENS.contains(&tokens).then_some((v, kernel))
}

/// A name's `<prefix>0_` or `<prefix>1_` (an epilogue quantizing as Q8_0 or Q8_1:
/// `Some(with_s)`) and the rest; `None` for another digit.
fn quantized_epilogue<'a>(name: &'a str, prefix: &str) -> Option<(Option<bool>, &'a str)> {
    let Some(r) = name.strip_prefix(prefix) else {
        return Some((None, name));
    };
    match r.split_once('_')? {
        ("0", k) => Some((Some(false), k)),
        ("1", k) => Some((Some(true), k)),
        _ => None,
    }
}

/// matmul_legacy_rows.wgsl for `tok` tokens per workgroup: an accumulator, a token index
/// (the last one repeated in a partial group), an add and a store for each.
pub(super) fn fill_legacy_rows(f: &Format, v: LegacyRows, sum_t: &str) -> String {
    let tok = v.tokens;
    let (mut declare, mut accumulate, mut store) = (String::new(), String::new(), String::new());
    for t in 0..tok {
        // Unrolled (one token): token 0, a constant, so activation offsets are too.
        let token = if v.unrolled > 0 {
            "0u".to_string()
        } else {
            format!("min(t0 + {t}u, last)")
        };
        declare.push_str(&format!(
            "    var acc{t} = 0.0;\n    let tok{t} = {token};\n"
        ));
        accumulate.push_str(&format!(
            "        acc{t} = acc{t} + opaque(token_value(k, tok{t}, blk, nb));\n"
        ));
        store.push_str(&format!(
            "    if (t0 + {t}u <= last) {{\n        OUT[P.out_off + tok{t} * P.out_stride + P.row0 + row] = acc{t};\n    }}\n"
        ));
    }
    let act = if v.uniform {
        include_str!("act_uniform.wgsl")
            .replace("{ACT_VEC4S}", &(ACT_UNIFORM_BYTES / 16).to_string())
    } else {
        include_str!("act_storage.wgsl").to_string()
    };
    let block = if v.texels {
        "tex_{NAME}(row + P.tex0, blk, nb)"
    } else {
        "blk_{NAME}(wr + blk * {BYTES}u)"
    };
    // Unrolled (one token): the scales' offsets are constants too, which the host checks
    // (`unrolled_offsets`): llvmpipe does not see an offset read from `P` as the same in
    // every lane.
    let (d_off, s_off) = match v.unrolled {
        0 => ("P.d_off".to_string(), "P.s_off".to_string()),
        nb => {
            let (d, s) = unrolled_offsets(f.activation, nb);
            (format!("{d}u"), format!("{s}u"))
        }
    };
    let mut src = String::new();
    if v.texels {
        src.push_str(&texel_fetch());
    }
    src.push_str(&include_str!("matmul_legacy_rows.wgsl").replace("{BLOCK}", block));
    if v.texels && v.unrolled > 0 {
        let main_at = src
            .find("@compute")
            .expect("the template has an entry point");
        src.truncate(main_at);
        if v.swiglu.is_some() || v.norm.is_some() {
            src.push_str(include_str!("quantize_blocks.wgsl"));
        }
        src.push_str(&texel_rows_main(f, v).replace("{SUM_T}", sum_t));
        return fill(&src, f)
            .replace("{TOK}", "1")
            .replace("{ACT}", act.trim_end())
            .replace("{D_OFF}", &d_off)
            .replace("{S_OFF}", &s_off);
    }
    let blocks = if v.unrolled > 0 {
        // (Texel kernels have theirs from `texel_rows_main`, above.)
        (0..v.unrolled)
            .map(|b| {
                format!(
                    "    {{\n        let blk = {b}u;\n        let k = {block};\n{{ACCUMULATE}}\n    }}"
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        format!("    for (var blk = 0u; blk < nb; blk++) {{\n        let k = {block};\n{{ACCUMULATE}}\n    }}")
    };
    fill(&src.replace("{BLOCKS}", &blocks), f)
        .replace("{TOK}", &tok.to_string())
        .replace("{ACT}", act.trim_end())
        .replace("{DECLARE}", declare.trim_end())
        .replace("{ACCUMULATE}", accumulate.trim_end())
        .replace("{STORE}", store.trim_end())
        .replace("{D_OFF}", &d_off)
        .replace("{S_OFF}", &s_off)
}

/// weights_texels.wgsl with the interleave `texels::repack` lays texels out by.
fn texel_fetch() -> String {
    let il = crate::texels::INTERLEAVE;
    include_str!("weights_texels.wgsl")
        .replace("{IL_SHIFT}", &il.trailing_zeros().to_string())
        .replace("{IL_MASK}", &(il - 1).to_string())
}

/// Weight rows an invocation of the unrolled texel kernel takes ([`texel_rows_main`]).
const TEXEL_ROWS_PER_LANE: u32 = 4;

/// The entry point of an unrolled (one token) texel kernel: 16 invocations take a
/// workgroup's 64 rows, 4 each, so each activation word — which llvmpipe reads lane by lane
/// even at a constant offset — is read once for 4 rows. Invocation i of a run of 8 (one of
/// llvmpipe's SIMD vectors) takes rows 8j + i of its 32, so the 8 lanes' fetches of a
/// texel are 128 contiguous bytes and their 4 fetches one run of 512 (crate::texels'
/// interleave of 32 rows). Each row's value is
/// the row kernel's, the same operations in the same order. With `segments` > 1 the rows
/// are several weights' (`P.b1`, `P.b2` the later ones' first rows), each stored to its
/// own output.
///
/// With `swiglu` (two segments, gate then up, of equal rows) a workgroup takes 32 rows of
/// each, so that its 32 SwiGLU values are one block of the down projection's activations:
/// invocation i of run k takes gate rows 16k + i and 16k + i + 8 and the same of up, stores
/// both outputs (gate's as silu(gate) · up, the SwiGLU kernel's arithmetic), keeps the
/// values in workgroup memory, and the first invocation quantizes the block
/// (quantize_blocks.wgsl, at the output's `P.d_off` and `P.s_off`: the input's are
/// constants here).
fn texel_rows_main(f: &Format, v: LegacyRows) -> String {
    let (nb, segments, uniform) = (v.unrolled, v.segments, v.uniform);
    let r = TEXEL_ROWS_PER_LANE;
    let lanes = WG / r;
    let mut outputs = String::new();
    for s in 1..segments {
        outputs.push_str(&format!(
            "@group(0) @binding({}) var<storage, read_write> OUT{s}: array<f32>;\n",
            4 + s
        ));
    }
    if v.rope {
        outputs.push_str(
            "@group(0) @binding(7) var<storage, read> CS: array<f32>;
@group(0) @binding(8) var<storage, read_write> KC: array<u32>;
@group(0) @binding(9) var<storage, read_write> VC: array<u32>;
var<workgroup> kept: array<f32, 64>;
var<workgroup> turned: array<f32, 64>;
",
        );
    }
    if v.norm.is_some() {
        outputs.push_str(
            "@group(0) @binding(6) var<storage, read_write> A: array<u32>;
@group(0) @binding(7) var<storage, read_write> X: array<f32>;
@group(0) @binding(8) var<storage, read> NW: array<f32>;
@group(0) @binding(9) var<storage, read_write> CNT: array<atomic<u32>>;
var<workgroup> last_sh: u32;
var<workgroup> row_scale: f32;
fn qin(i: u32) -> f32 {
    return (X[P.x_off + i] * row_scale) * NW[i];
}
",
        );
    }
    if v.swiglu.is_some() {
        outputs.push_str(
            "@group(0) @binding(6) var<storage, read_write> A: array<u32>;
var<workgroup> kept: array<f32, 32>;
fn qin(i: u32) -> f32 {
    return kept[i];
}
",
        );
    }
    // Each invocation's first row and its rows' offsets from it (j = 0 … r − 1).
    let (first, guard, row_of): (String, &str, Box<dyn Fn(u32) -> String>) = match v.swiglu {
        None => (
            format!(
                "(wid.y * nwg.x + wid.x) * {WG}u + (lid >> 3u) * {}u + (lid & 7u)",
                8 * r
            ),
            // Kernels with barriers return by workgroup, so that every invocation of one
            // that goes on reaches them.
            if v.rope || v.norm.is_some() {
                "base >= P.rows"
            } else {
                "first >= P.rows"
            },
            Box::new(|j| format!("min(first + {}u, last_row)", 8 * j)),
        ),
        Some(_) => (
            "(wid.y * nwg.x + wid.x) * 32u + (lid >> 3u) * 16u + (lid & 7u)".to_string(),
            "base / 2u >= P.b1",
            Box::new(|j| {
                let up = if j >= 2 { " + P.b1" } else { "" };
                format!("first + {}u{up}", 8 * (j % 2))
            }),
        ),
    };
    let quant_texels = if f.kernel == "q8_0" { 2 } else { 1 };
    // Q4_1's integer sums two products a multiply (`swar_q4_1`), from the activations' pair
    // words where they lie at a multiple of 4 words in the uniform buffer (after the sums:
    // quantize_blocks.wgsl), else built here.
    let swar = f.kernel == "q4_1";
    let pairs_at =
        Some(unrolled_offsets(f.activation, nb).1 + nb).filter(|p| p % 4 == 0 && uniform);
    let mut body = format!(
        "{outputs}@compute @workgroup_size({lanes})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    let first = {first};
    let base = (wid.y * nwg.x + wid.x) * {WG}u;
    if ({guard}) {{
        return;
    }}
    let nb = {nb}u;
    let last_row = P.rows - 1u;
    let zero = P.zero;
    let tex0 = P.tex0;
"
    );
    for j in 0..r {
        body.push_str(&format!(
            "    let row{j} = {} + tex0;
    var acc{j} = 0.0;
",
            row_of(j)
        ));
    }
    for b in 0..nb {
        if b % 4 == 0 {
            for j in 0..r {
                body.push_str(&format!(
                    "    let sc{g}_{j} = tex_scales(row{j}, nb, {quant_texels}u, {g}u);
",
                    g = b / 4
                ));
            }
        }
        body.push_str(&format!(
            "    {{
        let lo = act_quants({a}u);
        let hi = act_quants({a4}u);
        let da = bitcast<f32>(act_word({{D_OFF}} + {b}u));
        let sa = bitcast<f32>(act_word({{S_OFF}} + {b}u));
",
            a = b * 8,
            a4 = b * 8 + 4
        ));
        if swar && pairs_at.is_some() {
            let at = pairs_at.unwrap_or_default() / 4 + 4 * b;
            body.push_str(&format!(
                "        let pl = Pairs(AU[{at}u], AU[{}u]);\n        let ph = Pairs(AU[{}u], AU[{}u]);\n",
                at + 1,
                at + 2,
                at + 3
            ));
        } else if swar {
            body.push_str("        let pl = act_pairs(lo);\n        let ph = act_pairs(hi);\n");
        }
        for j in 0..r {
            let (g, i) = (b / 4, b % 4);
            body.push_str(&if swar {
                format!(
                    "        {{
            let v = texel(row{j}, {b}u);
            acc{j} = acc{j} + opaque_with(bval_q4_1(q4_1_block(sc{g}_{j}[{i}], v), swar_q4_1(v, pl, ph), da, sa), zero);
        }}
"
                )
            } else {
                format!(
                    "        acc{j} = acc{j} + opaque_with(block_value(tex_{{NAME}}_s(row{j}, {b}u, sc{g}_{j}[{i}]), lo, hi, da, sa), zero);
"
                )
            });
        }
        body.push_str(
            "    }
",
        );
    }
    if v.rope {
        // A workgroup is one head of q, k or v (P.b1, P.b2: where k's and v's rows start).
        // Its rows are kept, then pairs turned as the rope kernel turns them (one token:
        // pair p's cos and sin at CS[2p], CS[2p + 1]), then k's and v's stored as F16
        // words as store_f16 stores them.
        for j in 0..r {
            body.push_str(&format!("    kept[first + {}u - base] = acc{j};\n", 8 * j));
        }
        body.push_str(
            "    workgroupBarrier();
    let is_k = base >= P.b1 && base < P.b2;
    let is_v = base >= P.b2;
    let half = 32u;
    for (var p = lid; p < half; p += 16u) {
        var e0 = p;
        var e1 = p + half;
        if (P.neox == 0u) {
            e0 = 2u * p;
            e1 = 2u * p + 1u;
        }
        let x0 = kept[e0];
        let x1 = kept[e1];
        var t = vec2<f32>(x0, x1);
        if (!is_v) {
            let c = CS[2u * p];
            let s = CS[2u * p + 1u];
            t = vec2<f32>(x0 * c - x1 * s, x0 * s + x1 * c);
        }
        turned[e0] = t.x;
        turned[e1] = t.y;
        if (is_v) {
            OUT2[P.out2_off + base - P.b2 + e0] = t.x;
            OUT2[P.out2_off + base - P.b2 + e1] = t.y;
        } else if (is_k) {
            OUT1[P.out1_off + base - P.b1 + e0] = t.x;
            OUT1[P.out1_off + base - P.b1 + e1] = t.y;
        } else {
            OUT[P.out_off + base + e0] = t.x;
            OUT[P.out_off + base + e1] = t.y;
        }
    }
    workgroupBarrier();
    for (var w = lid; w < half; w += 16u) {
        let word = f16_bits(turned[2u * w]) | (f16_bits(turned[2u * w + 1u]) << 16u);
        if (is_v) {
            VC[P.vc_off + (base - P.b2) / 2u + w] = word;
        } else if (is_k) {
            KC[P.kc_off + (base - P.b1) / 2u + w] = word;
        }
    }
}
",
        );
        return body;
    }
    if let Some(with_s) = v.swiglu {
        body.push_str(&format!(
            "    let s0 = op_swiglu(acc0, acc2);
    let s1 = op_swiglu(acc1, acc3);
    OUT[P.out_off + first] = s0;
    OUT[P.out_off + first + 8u] = s1;
    OUT1[P.out1_off + first] = acc2;
    OUT1[P.out1_off + first + 8u] = acc3;
    let k = (lid >> 3u) * 16u + (lid & 7u);
    kept[k] = s0;
    kept[k + 8u] = s1;
    workgroupBarrier();
    if (lid == 0u) {{
        quantize_32(wid.y * nwg.x + wid.x, 0u, {with_s});
    }}
}}
"
        ));
        return body;
    }
    for j in 0..r {
        let o = 8 * j;
        let store = match segments {
            0 | 1 => format!("OUT[P.out_off + P.row0 + g] = acc{j};"),
            2 => format!(
                "if (g < P.b1) {{ OUT[P.out_off + P.row0 + g] = acc{j}; }} \
                 else {{ OUT1[P.out1_off + g - P.b1] = acc{j}; }}"
            ),
            _ => format!(
                "if (g < P.b1) {{ OUT[P.out_off + P.row0 + g] = acc{j}; }} \
                 else if (g < P.b2) {{ OUT1[P.out1_off + g - P.b1] = acc{j}; }} \
                 else {{ OUT2[P.out2_off + g - P.b2] = acc{j}; }}"
            ),
        };
        body.push_str(&format!(
            "    {{
        let g = first + {o}u;
        if (g <= last_row) {{
            {store}
        }}
    }}
"
        ));
    }
    if let Some(with_s) = v.norm {
        // The last workgroup to finish adds h (OUT, all rows now written) into the residual
        // stream X and normalises it into OUT, as narrow_add_rms_norm_q8_* does.
        body.push_str(&format!(
            "    workgroupBarrier();
    if (lid == 0u) {{
        last_sh = u32(atomicAdd(&CNT[0], 1u) == nwg.x * nwg.y - 1u);
    }}
    if (workgroupUniformLoad(&last_sh) == 0u) {{
        return;
    }}
    if (lid == 0u) {{
        var s = {{SUM_T}}(0);
        for (var i = 0u; i < P.rows; i++) {{
            let xi = X[P.x_off + i] + OUT[P.out_off + i];
            X[P.x_off + i] = xi;
            let v = {{SUM_T}}(xi);
            s = s + v * v;
        }}
        let mean = f32(s / {{SUM_T}}(P.rows));
        row_scale = 1.0 / sqrt(mean + bitcast<f32>(P.eps));
        atomicStore(&CNT[0], 0u);
    }}
    workgroupBarrier();
    let scale = row_scale;
    for (var i = lid; i < P.rows; i += {lanes}u) {{
        OUT[P.out_off + i] = (X[P.x_off + i] * scale) * NW[i];
    }}
    for (var b = lid; b < P.rows / 32u; b += {lanes}u) {{
        quantize_32(b, 32u * b, {with_s});
    }}
"
        ));
    }
    body.push_str(
        "}
",
    );
    body
}

#[cfg(test)]
mod tests {
    use crate::texels::INTERLEAVE;

    #[test]
    fn the_kernels_fetch_texels_where_repack_puts_them() {
        let shift = INTERLEAVE.trailing_zeros();
        assert_eq!(1 << shift, INTERLEAVE);
        let fetch = format!(
            "textureLoad(WT, vec2<u32>((t << {shift}u) | (row & {}u), row >> {shift}u))",
            INTERLEAVE - 1
        );
        let kernel = super::super::source("rowmatmul_tok1_ubo_tex_nb18_q4_1", false)
            .expect("a texel kernel");
        assert!(kernel.contains(&fetch));
    }
}
