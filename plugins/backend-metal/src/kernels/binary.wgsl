// {NAME}: X[i] = op(X[i], Y[i % period]) over n elements (from x_off and y_off), with the CPU backend's numerics:
// add, add_bias (Y is the bias, period its length), swiglu (common.wgsl) and geglu (SiLU and
// tanh-GELU as x / (1 + e^-z) with the CPU's own e^x, ops/activation.rs).
struct Params {
    n: u32,
    period: u32,
    x_off: u32,
    y_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> X: array<f32>;
@group(0) @binding(2) var<storage, read> Y: array<f32>;

fn op_add(a: f32, b: f32) -> f32 {
    return a + b;
}

fn op_add_bias(a: f32, b: f32) -> f32 {
    return a + b;
}

// gelu_tanh(g) · up, gelu_tanh(g) = g / (1 + e^−(2√(2/π) g (1 + 0.044715 g²))).
fn op_geglu(g: f32, up: f32) -> f32 {
    let inner = 1.0 + (0.044715 * g) * g;
    let z = (1.595769 * g) * inner;
    return (g / (1.0 + exp_cpu(-z))) * up;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_id(wid, nwg, lid, 64u);
    if (i >= P.n) {
        return;
    }
    let x = P.x_off + i;
    X[x] = op_{NAME}(X[x], Y[P.y_off + i % P.period]);
}
