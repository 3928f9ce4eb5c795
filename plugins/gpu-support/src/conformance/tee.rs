//! [`Tee`]: the CPU and the GPU behind one backend, so that a model's forward pass runs
//! every operation on both with the same inputs and says which kind of operation a
//! model-level difference starts in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult::ROk, RSlice, RSliceMut, RString};
use prima_abi::backend::{
    AttentionParams, Backend, BackendBox, BackendResult, Backend_TO, KvSpec, RopeParams, TensorView,
};
use prima_abi::GgmlType;
use prima_core::model::{Model, Session};

use super::{argmax, max_abs_diff};

/// Per kind of operation: (calls, calls that differed, largest |Δ|).
pub type OpStats = Arc<Mutex<BTreeMap<&'static str, (u32, u32, f32)>>>;

/// Both backends behind one: every operation runs on the CPU and on the GPU with the same
/// inputs, the CPU's result goes on, and each kind of operation records how often and how
/// far the GPU's differed. Tells which operation a model-level difference starts in.
pub struct Tee {
    cpu: BackendBox,
    gpu: BackendBox,
    /// cpu KV id → gpu KV id.
    kv: Mutex<HashMap<u64, u64>>,
    stats: OpStats,
}

impl Tee {
    fn note(&self, op: &'static str, cpu: &[f32], gpu: &[f32]) {
        let d = max_abs_diff(cpu, gpu);
        let mut st = self.stats.lock().unwrap();
        let e = st.entry(op).or_insert((0, 0, 0.0));
        e.0 += 1;
        if d > 0.0 || cpu.iter().zip(gpu).any(|(a, b)| a.to_bits() != b.to_bits()) {
            e.1 += 1;
        }
        e.2 = e.2.max(d);
    }

    /// Runs `f` on both with copies of `buf`, keeps the CPU's.
    fn both(
        &self,
        op: &'static str,
        buf: &mut [f32],
        f: impl Fn(&BackendBox, &mut [f32]) -> BackendResult<()>,
    ) -> BackendResult<()> {
        let mut g = buf.to_vec();
        f(&self.gpu, &mut g).unwrap();
        let r = f(&self.cpu, buf);
        self.note(op, buf, &g);
        r
    }
}

impl Backend for Tee {
    fn name(&self) -> RString {
        "tee".into()
    }
    fn describe(&self) -> RString {
        format!("cpu + {}", self.gpu.name()).into()
    }
    fn supports(&self, t: u32) -> bool {
        self.cpu.supports(t) && self.gpu.supports(t)
    }
    fn get_rows(
        &self,
        table: TensorView<'_>,
        ids: RSlice<'_, u32>,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.both("get_rows", out.as_mut_slice(), |be, o| {
            be.get_rows(table, ids, RSliceMut::from_mut_slice(o))
        })
    }
    fn matmul(
        &self,
        w: TensorView<'_>,
        x: RSlice<'_, f32>,
        n: u32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let op = match GgmlType::from_id(w.ggml_type).map(|t| t.name()) {
            Some("F32") => "matmul F32",
            Some("F16") => "matmul F16",
            Some("Q4_0") => "matmul Q4_0",
            Some("Q4_1") => "matmul Q4_1",
            Some("Q5_0") => "matmul Q5_0",
            Some("Q5_1") => "matmul Q5_1",
            Some("Q8_0") => "matmul Q8_0",
            Some("Q2_K") => "matmul Q2_K",
            Some("Q3_K") => "matmul Q3_K",
            Some("Q4_K") => "matmul Q4_K",
            Some("Q5_K") => "matmul Q5_K",
            Some("Q6_K") => "matmul Q6_K",
            _ => "matmul other",
        };
        self.both(op, out.as_mut_slice(), |be, o| {
            be.matmul(w, x, n, RSliceMut::from_mut_slice(o))
        })
    }
    fn rms_norm(
        &self,
        x: RSlice<'_, f32>,
        w: TensorView<'_>,
        eps: f32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.both("rms_norm", out.as_mut_slice(), |be, o| {
            be.rms_norm(x, w, eps, RSliceMut::from_mut_slice(o))
        })
    }
    fn add(&self, mut acc: RSliceMut<'_, f32>, x: RSlice<'_, f32>) -> BackendResult<()> {
        self.both("add", acc.as_mut_slice(), |be, o| {
            be.add(RSliceMut::from_mut_slice(o), x)
        })
    }
    fn add_bias(&self, mut x: RSliceMut<'_, f32>, b: TensorView<'_>) -> BackendResult<()> {
        self.both("add_bias", x.as_mut_slice(), |be, o| {
            be.add_bias(RSliceMut::from_mut_slice(o), b)
        })
    }
    fn scale(&self, mut x: RSliceMut<'_, f32>, v: f32) -> BackendResult<()> {
        self.both("scale", x.as_mut_slice(), |be, o| {
            be.scale(RSliceMut::from_mut_slice(o), v)
        })
    }
    fn rope(
        &self,
        mut x: RSliceMut<'_, f32>,
        n_head: u32,
        head_dim: u32,
        pos: RSlice<'_, u32>,
        p: RopeParams<'_>,
    ) -> BackendResult<()> {
        self.both("rope", x.as_mut_slice(), |be, o| {
            be.rope(RSliceMut::from_mut_slice(o), n_head, head_dim, pos, p)
        })
    }
    fn swiglu(&self, mut g: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.both("swiglu", g.as_mut_slice(), |be, o| {
            be.swiglu(RSliceMut::from_mut_slice(o), up)
        })
    }
    fn geglu(&self, mut g: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.both("geglu", g.as_mut_slice(), |be, o| {
            be.geglu(RSliceMut::from_mut_slice(o), up)
        })
    }
    fn kv_create(&self, spec: KvSpec) -> BackendResult<u64> {
        let g = self.gpu.kv_create(spec).unwrap();
        let c = self.cpu.kv_create(spec).unwrap();
        self.kv.lock().unwrap().insert(c, g);
        ROk(c)
    }
    fn kv_drop(&self, kv: u64) {
        if let Some(g) = self.kv.lock().unwrap().remove(&kv) {
            self.gpu.kv_drop(g);
        }
        self.cpu.kv_drop(kv);
    }
    fn kv_truncate(&self, kv: u64, n: u32) -> BackendResult<()> {
        let g = self.kv.lock().unwrap()[&kv];
        self.gpu.kv_truncate(g, n).unwrap();
        self.cpu.kv_truncate(kv, n)
    }
    fn attention(
        &self,
        kv: u64,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        p: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let g = self.kv.lock().unwrap()[&kv];
        let mut go = out.as_slice().to_vec();
        self.gpu
            .attention(g, q, k, v, p, RSliceMut::from_mut_slice(&mut go))
            .unwrap();
        let r = self.cpu.attention(
            kv,
            q,
            k,
            v,
            p,
            RSliceMut::from_mut_slice(out.as_mut_slice()),
        );
        self.note("attention", out.as_slice(), &go);
        r
    }
    fn idle(&self) {
        self.cpu.idle();
        self.gpu.idle();
    }
}

/// Runs `prompt` and 4 greedy steps of the model at `path` through a [`Tee`] of `cpu` and
/// `gpu`; prints, per kind of operation, how many calls differed and by how much, and
/// returns the kinds that differed (`"<name> <op>: <largest |Δ|>"`).
pub fn differing_operations(
    cpu: BackendBox,
    gpu: BackendBox,
    paths: &[std::path::PathBuf],
    prompt: &[u32],
) -> Vec<String> {
    let stats = OpStats::default();
    let tee = Backend_TO::from_value(
        Tee {
            cpu,
            gpu,
            kv: Default::default(),
            stats: stats.clone(),
        },
        TD_Opaque,
    );
    let mut differing = Vec::new();
    for path in paths {
        stats.lock().unwrap().clear();
        let model = Model::load(path).unwrap();
        let mut s = Session::new(&model, &tee, 256, 64).unwrap();
        let mut next = argmax(s.eval(prompt).unwrap()) as u32;
        for _ in 0..4 {
            next = argmax(s.eval(&[next]).unwrap()) as u32;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        for (op, (calls, diff, worst)) in stats.lock().unwrap().iter() {
            println!("{name}: {op:<12} {calls:>4} calls, {diff:>4} differ, max |Δ| {worst:.2e}");
            if *diff > 0 {
                differing.push(format!("{name} {op}: {worst:.2e}"));
            }
        }
    }
    differing
}
