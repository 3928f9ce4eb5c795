// F32, F16 and BF16 weights: a "block" is one element. `deq_<name>(b, 0)` reads the element
// at byte offset b (get_rows), `elem_<name>(row, e)` element e of the row at byte offset
// `row` (matmul), `act_<name>` rounds an activation as the CPU multiplies it: as is for
// F32, to F16 for F16 and to BF16 for BF16 weights (each product is then exact in f32).
// `term_<name>(w, x, acc)` adds one product to an accumulator as the CPU's canonical dot
// does (formats/float.rs `DOT_LANES`): fused for F32 (`fma`, one rounding), a product then
// a sum for F16 and BF16, whose exact products round alike either way.

fn deq_f32(b: u32, j: u32) -> f32 {
    return bitcast<f32>(W[b >> 2u]);
}

fn deq_f16(b: u32, j: u32) -> f32 {
    return w_f16(b);
}

fn deq_bf16(b: u32, j: u32) -> f32 {
    return bitcast<f32>(w_u16(b) << 16u);
}

fn elem_f32(row: u32, e: u32) -> f32 {
    return bitcast<f32>(W[(row >> 2u) + e]);
}

fn elem_f16(row: u32, e: u32) -> f32 {
    let word = W[(row >> 2u) + (e >> 1u)];
    return f16_to_f32(word >> ((e & 1u) * 16u));
}

fn elem_bf16(row: u32, e: u32) -> f32 {
    let word = W[(row >> 2u) + (e >> 1u)];
    return bitcast<f32>(((word >> ((e & 1u) * 16u)) & 0xffffu) << 16u);
}

fn term_f32(w: f32, x: f32, acc: f32) -> f32 {
    return fma(w, x, acc);
}

fn term_f16(w: f32, x: f32, acc: f32) -> f32 {
    return acc + w * x;
}

fn term_bf16(w: f32, x: f32, acc: f32) -> f32 {
    return acc + w * x;
}

fn act_f32(x: f32) -> f32 {
    return x;
}

fn act_f16(x: f32) -> f32 {
    return round_f16(x);
}

fn act_bf16(x: f32) -> f32 {
    return round_bf16(x);
}
