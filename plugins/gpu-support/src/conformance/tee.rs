//! [`Tee`]: the CPU and the GPU behind one backend, so that a model's forward pass runs
//! every operation on both with the same inputs and says which kind of operation a
//! model-level difference starts in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult::ROk, RSlice, RSliceMut, RString};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, Backend, BackendBox, BackendResult, Backend_TO, Buf, KvSpec,
    RopeParams, TensorView, TransferCounts,
};
use prima_abi::GgmlType;
use prima_core::model::{Model, Session};

use super::{argmax, max_abs_diff};

/// Per kind of operation: (calls, calls that differed, largest |Δ|).
pub type OpStats = Arc<Mutex<BTreeMap<&'static str, (u32, u32, f32)>>>;

/// Both backends behind one: every operation runs on the CPU and on the GPU with the same
/// inputs, the CPU's result goes on (copied into the GPU's buffer), and each kind of
/// operation records how often and how far the GPU's differed. Tells which operation a
/// model-level difference starts in. A tee buffer is a pair: the CPU's id (which the
/// engine sees) and the GPU's; KV caches likewise.
pub struct Tee {
    cpu: BackendBox,
    gpu: BackendBox,
    /// cpu buffer id → gpu buffer id.
    bufs: Mutex<HashMap<u64, u64>>,
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

    /// The GPU's half of tee buffer range `b`.
    fn gpu_buf(&self, b: Buf) -> Buf {
        Buf {
            id: self.bufs.lock().unwrap()[&b.id],
            ..b
        }
    }

    fn gpu_kv(&self, kv: u64) -> u64 {
        self.kv.lock().unwrap()[&kv]
    }

    /// Runs `f` on both (given each backend and how a tee buffer maps to its own), compares
    /// `out` and copies the CPU's into the GPU's.
    fn both(
        &self,
        op: &'static str,
        out: Buf,
        f: impl Fn(&BackendBox, &dyn Fn(Buf) -> Buf) -> BackendResult<()>,
    ) -> BackendResult<()> {
        let to_gpu = |b: Buf| self.gpu_buf(b);
        f(&self.gpu, &to_gpu).unwrap();
        let r = f(&self.cpu, &|b| b);
        if r.is_ok() {
            let (mut c, mut g) = (vec![0f32; out.len()], vec![0f32; out.len()]);
            self.cpu
                .download(out, RSliceMut::from_mut_slice(&mut c))
                .unwrap();
            self.gpu
                .download(to_gpu(out), RSliceMut::from_mut_slice(&mut g))
                .unwrap();
            self.note(op, &c, &g);
            self.gpu
                .upload(to_gpu(out), RSlice::from_slice(&c))
                .unwrap();
        }
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
    fn buf_create(&self, len: u64) -> BackendResult<u64> {
        let g = self.gpu.buf_create(len).unwrap();
        let c = self.cpu.buf_create(len).unwrap();
        self.bufs.lock().unwrap().insert(c, g);
        ROk(c)
    }
    fn buf_drop(&self, id: u64) {
        if let Some(g) = self.bufs.lock().unwrap().remove(&id) {
            self.gpu.buf_drop(g);
        }
        self.cpu.buf_drop(id);
    }
    fn upload(&self, dst: Buf, src: RSlice<'_, f32>) -> BackendResult<()> {
        self.gpu.upload(self.gpu_buf(dst), src).unwrap();
        self.cpu.upload(dst, src)
    }
    fn download(&self, src: Buf, dst: RSliceMut<'_, f32>) -> BackendResult<()> {
        self.cpu.download(src, dst)
    }
    fn transfers(&self) -> TransferCounts {
        self.cpu.transfers()
    }
    fn get_rows(&self, table: TensorView<'_>, ids: RSlice<'_, u32>, out: Buf) -> BackendResult<()> {
        self.both("get_rows", out, |be, b| be.get_rows(table, ids, b(out)))
    }
    fn matmul(&self, w: TensorView<'_>, x: Buf, n: u32, out: Buf) -> BackendResult<()> {
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
        self.both(op, out, |be, b| be.matmul(w, b(x), n, b(out)))
    }
    fn rms_norm(&self, x: Buf, w: TensorView<'_>, eps: f32, out: Buf) -> BackendResult<()> {
        self.both("rms_norm", out, |be, b| be.rms_norm(b(x), w, eps, b(out)))
    }
    fn add(&self, acc: Buf, x: Buf) -> BackendResult<()> {
        self.both("add", acc, |be, b| be.add(b(acc), b(x)))
    }
    fn add_bias(&self, x: Buf, bias: TensorView<'_>) -> BackendResult<()> {
        self.both("add_bias", x, |be, b| be.add_bias(b(x), bias))
    }
    fn scale(&self, x: Buf, v: f32) -> BackendResult<()> {
        self.both("scale", x, |be, b| be.scale(b(x), v))
    }
    fn rope(
        &self,
        x: Buf,
        n_head: u32,
        head_dim: u32,
        pos: RSlice<'_, u32>,
        p: RopeParams<'_>,
    ) -> BackendResult<()> {
        self.both("rope", x, |be, b| be.rope(b(x), n_head, head_dim, pos, p))
    }
    fn swiglu(&self, g: Buf, up: Buf) -> BackendResult<()> {
        self.both("swiglu", g, |be, b| be.swiglu(b(g), b(up)))
    }
    fn geglu(&self, g: Buf, up: Buf) -> BackendResult<()> {
        self.both("geglu", g, |be, b| be.geglu(b(g), b(up)))
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
        self.gpu.kv_truncate(self.gpu_kv(kv), n).unwrap();
        self.cpu.kv_truncate(kv, n)
    }
    fn attention_spans(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: Buf,
        k: Buf,
        v: Buf,
        p: AttentionParams,
        out: Buf,
    ) -> BackendResult<()> {
        let gpu_spans: Vec<AttentionSpan> = spans
            .iter()
            .map(|s| AttentionSpan {
                kv: self.gpu_kv(s.kv),
                ..*s
            })
            .collect();
        let is_gpu = |be: &BackendBox| std::ptr::eq(be, &self.gpu);
        self.both("attention", out, |be, b| {
            let spans = if is_gpu(be) {
                RSlice::from_slice(&gpu_spans)
            } else {
                spans
            };
            be.attention_spans(spans, b(q), b(k), b(v), p, b(out))
        })
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
            bufs: Default::default(),
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
