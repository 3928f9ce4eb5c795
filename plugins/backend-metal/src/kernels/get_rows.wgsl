// get_rows_{NAME}: OUT[r][e] = dequantize(row IDS[r] of the weight, element e), one
// invocation per output element, for the rows this weight part holds (row0 .. row0 + rows).
struct Params {
    cols: u32,
    row_bytes: u32,
    n_ids: u32,
    row0: u32,
    rows: u32,
    out_off: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(2) var<storage, read> IDS: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = flat_id(wid, nwg, lid, 64u);
    if (idx >= P.n_ids * P.cols) {
        return;
    }
    let r = idx / P.cols;
    let e = idx % P.cols;
    let id = IDS[r];
    if (id < P.row0 || id - P.row0 >= P.rows) {
        return;
    }
    let b = (id - P.row0) * P.row_bytes + (e / {QK}u) * {BYTES}u;
    OUT[P.out_off + idx] = deq_{NAME}(b, e % {QK}u);
}
