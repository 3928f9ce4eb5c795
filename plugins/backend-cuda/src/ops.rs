//! The backend operations on the GPU, host side: argument checks (the CPU backend's), the
//! uploads, the launches and the downloads.
//!
//! Phase 1 of the CUDA backend follows the host-slice ABI (v2): every operation uploads its
//! activations, runs, and copies its result back, synchronising once per operation. Only
//! weights (cached by mapping address) and the KV cache stay in VRAM. The device-resident
//! ABI — activations that stay on the GPU between operations, one synchronisation per
//! token — replaces the upload/download pairs below (`upload`, `download`) in phase 2.

use std::collections::HashMap;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use prima_abi::backend::{AttentionParams, KvSpec, RopeParams, TensorView};

use crate::device::{drv, grid_1d, Gpu};
use crate::formats::{Activation, WeightShape};
use crate::kernels::{Family, ATT_MAX_HEAD_DIM, ATT_WARPS, MATMUL_TOKENS, MATMUL_WARPS};
use prima_gpu_support::backend::GpuOps;
use prima_gpu_support::checks::{add_bias_args, expect_len, rms_norm_args, rope_args, OpResult};
use prima_gpu_support::kv::KvCaches;

/// Everything the backend keeps on the GPU.
pub struct State {
    pub gpu: Gpu,
    /// Weights in their stored layout, by (mapping address, length, type): the views are
    /// slices of a read-only mapping that outlives the backend's use of it.
    weights: HashMap<(usize, usize, u32), CudaSlice<u8>>,
    pub weight_bytes: u64,
    kv: KvCaches<CudaSlice<u16>>,
}

/// A matmul's activations as quantize.cu writes them (see `matmul_q` in rows.cuh).
struct QuantizedActivations {
    q: CudaSlice<i8>,
    d: CudaSlice<f32>,
    /// Q8_1's `d·Σq` per block.
    s: Option<CudaSlice<f32>>,
    /// Q8_K's sums of 16 quants.
    bsums: Option<CudaSlice<i16>>,
}

impl State {
    pub fn new(gpu: Gpu) -> State {
        State {
            gpu,
            weights: HashMap::new(),
            weight_bytes: 0,
            kv: KvCaches::default(),
        }
    }

    /// The weight's VRAM copy, uploaded on first use.
    fn weight(&mut self, bytes: &[u8], ty: u32) -> OpResult<&CudaSlice<u8>> {
        let key = (bytes.as_ptr() as usize, bytes.len(), ty);
        if !self.weights.contains_key(&key) {
            let dev = drv("uploading a weight", self.gpu.stream.clone_htod(bytes))?;
            self.weight_bytes += bytes.len() as u64;
            self.weights.insert(key, dev);
        }
        Ok(&self.weights[&key])
    }

    fn upload<T: cudarc::driver::DeviceRepr>(
        &self,
        what: &str,
        host: &[T],
    ) -> OpResult<CudaSlice<T>> {
        drv(
            &format!("uploading {what}"),
            self.gpu.stream.clone_htod(host),
        )
    }

    fn download<T: cudarc::driver::DeviceRepr>(
        &self,
        what: &str,
        dev: &CudaSlice<T>,
        host: &mut [T],
    ) -> OpResult<()> {
        drv(
            &format!("downloading {what}"),
            self.gpu.stream.memcpy_dtoh(dev, host),
        )
    }

    fn alloc(&self, what: &str, n: usize) -> OpResult<CudaSlice<f32>> {
        // SAFETY: every element is written by the kernel before it is read back.
        drv(&format!("allocating {what}"), unsafe {
            self.gpu.stream.alloc::<f32>(n.max(1))
        })
    }

    /// `x` (on the GPU, `n` floats, whole blocks of `act`) quantized as the CPU backend
    /// quantizes a matmul's activations, once per product.
    fn quantize_activations(
        &mut self,
        act: Activation,
        x: &CudaSlice<f32>,
        n: usize,
    ) -> OpResult<QuantizedActivations> {
        let kernel = act
            .quantize_kernel()
            .ok_or("float activations are not quantized")?;
        let f = self.gpu.function(Family::Quantize, kernel)?;
        let n_blocks = n / act.block_elems();
        let stream = self.gpu.stream.clone();
        // SAFETY (the three allocations): the quantize kernel writes every element (one
        // quant per input element, one d/s per block, one sum per 16 elements) before the
        // matmul reads them.
        let mut q = drv("allocating activation quants", unsafe {
            stream.alloc::<i8>(n.max(1))
        })?;
        let mut d = self.alloc("activation scales", n_blocks)?;
        let mut s = match act {
            Activation::Q8_1 => Some(self.alloc("activation sums", n_blocks)?),
            _ => None,
        };
        let mut bsums = match act {
            Activation::Q8K => Some(drv("allocating activation sums", unsafe {
                stream.alloc::<i16>((n / 16).max(1))
            })?),
            _ => None,
        };
        let nb = n_blocks as u64;
        // One warp per block, eight warps per thread block.
        let cfg = LaunchConfig {
            grid_dim: (n_blocks.div_ceil(8) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&f);
        b.arg(x).arg(&mut q).arg(&mut d);
        if let Some(s) = s.as_mut() {
            b.arg(s);
        }
        if let Some(bs) = bsums.as_mut() {
            b.arg(bs);
        }
        b.arg(&nb);
        // SAFETY: quantize_q8_0(const float* x, i8* q, float* d, u64 n_blocks),
        // quantize_q8_1(…, float* d, float* s, u64), quantize_q8_k(…, float* d,
        // short* bsums, u64): x holds n_blocks whole blocks, the outputs are sized above.
        drv("launching the activation quantizer", unsafe {
            b.launch(cfg)
        })?;
        Ok(QuantizedActivations { q, d, s, bsums })
    }

    /// `kernel(a, b, n)` over two equal-length vectors, `a` updated in place.
    fn binary(&mut self, op: &'static str, a: &mut [f32], b: &[f32]) -> OpResult<()> {
        expect_len(op, "second operand length", b.len(), a.len())?;
        if a.is_empty() {
            return Ok(());
        }
        let f = self.gpu.function(Family::Elementwise, op)?;
        let stream = self.gpu.stream.clone();
        let mut a_dev = self.upload("activations", a)?;
        let b_dev = self.upload("activations", b)?;
        let n = a.len() as u64;
        let mut l = stream.launch_builder(&f);
        l.arg(&mut a_dev).arg(&b_dev).arg(&n);
        // SAFETY: op(float* a, const float* b, u64 n) with both n long.
        drv(op, unsafe { l.launch(grid_1d(n)) })?;
        self.download(op, &a_dev, a)
    }
}

impl GpuOps for State {
    const NAME: &'static str = "cuda";

    fn get_rows(&mut self, table: &TensorView<'_>, ids: &[u32], out: &mut [f32]) -> OpResult<()> {
        let shape = WeightShape::for_get_rows("CUDA", table, ids, out.len())?;
        if ids.is_empty() || shape.cols == 0 {
            return Ok(());
        }
        let f = self
            .gpu
            .function(shape.format.family.into(), shape.format.get_rows)?;
        let ids_dev = self.upload("row ids", ids)?;
        let mut out_dev = self.alloc("rows", out.len())?;
        let n_ids = ids.len() as u32;
        let stream = self.gpu.stream.clone();
        let w = self.weight(table.data.as_slice(), table.ggml_type)?;
        let chunks = shape.cols / 32;
        let cfg = LaunchConfig {
            grid_dim: (chunks.div_ceil(128), n_ids, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&f);
        b.arg(w)
            .arg(&ids_dev)
            .arg(&mut out_dev)
            .arg(&shape.cols)
            .arg(&shape.row_bytes)
            .arg(&n_ids);
        // SAFETY: get_rows_<fmt>(const u8*, const u32*, float*, u32, u64, u32); the weight holds
        // `rows` rows of `row_bytes`, every id < rows, out holds n_ids × cols floats.
        drv("launching get_rows", unsafe { b.launch(cfg) })?;
        self.download("rows", &out_dev, out)
    }

    fn matmul(
        &mut self,
        w: &TensorView<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) -> OpResult<()> {
        let shape = WeightShape::for_matmul("CUDA", w, x.len(), n_tokens, out.len())?;
        if n_tokens == 0 || shape.rows == 0 {
            return Ok(());
        }
        let f = self
            .gpu
            .function(shape.format.family.into(), shape.format.matmul)?;
        let x_dev = self.upload("activations", x)?;
        let mut out_dev = self.alloc("matmul output", out.len())?;
        let n = n_tokens as u32;
        let cfg = LaunchConfig {
            grid_dim: (
                shape.rows.div_ceil(MATMUL_WARPS),
                n.div_ceil(MATMUL_TOKENS),
                1,
            ),
            block_dim: (32 * MATMUL_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let stream = self.gpu.stream.clone();
        match shape.format.activation {
            Activation::Float => {
                let w_dev = self.weight(w.data.as_slice(), w.ggml_type)?;
                let mut b = stream.launch_builder(&f);
                b.arg(w_dev)
                    .arg(&x_dev)
                    .arg(&mut out_dev)
                    .arg(&shape.cols)
                    .arg(&shape.rows)
                    .arg(&shape.row_bytes)
                    .arg(&n);
                // SAFETY: matmul_<fmt>(const u8* w, const float* x, float* out, u32 cols,
                // u32 rows, u64 row_bytes, u32 n_tokens), x n_tokens × cols, out
                // n_tokens × rows.
                drv("launching matmul", unsafe { b.launch(cfg) })?;
            }
            act => {
                let a = self.quantize_activations(act, &x_dev, x.len())?;
                let w_dev = self.weight(w.data.as_slice(), w.ggml_type)?;
                let null = 0u64;
                let mut b = stream.launch_builder(&f);
                b.arg(w_dev).arg(&a.q).arg(&a.d);
                match &a.s {
                    Some(s) => b.arg(s),
                    None => b.arg(&null),
                };
                match &a.bsums {
                    Some(bs) => b.arg(bs),
                    None => b.arg(&null),
                };
                b.arg(&mut out_dev)
                    .arg(&shape.cols)
                    .arg(&shape.rows)
                    .arg(&shape.row_bytes)
                    .arg(&n);
                // SAFETY: matmul_<fmt>(const u8* w, const i8* q, const float* d,
                // const float* s, const short* bsums, float* out, u32 cols, u32 rows,
                // u64 row_bytes, u32 n_tokens): q n_tokens × cols quants, d (and s) one per
                // activation block, bsums one per 16 elements (those the kind has; the
                // kernel reads only those), out n_tokens × rows.
                drv("launching matmul", unsafe { b.launch(cfg) })?;
            }
        }
        self.download("matmul output", &out_dev, out)
    }

    fn rms_norm(
        &mut self,
        x: &[f32],
        weight: &TensorView<'_>,
        eps: f32,
        out: &mut [f32],
    ) -> OpResult<()> {
        let (wb, n) = rms_norm_args(x.len(), weight, out.len())?;
        if x.is_empty() {
            return Ok(());
        }
        let f = self.gpu.function(Family::Elementwise, "rms_norm")?;
        let x_dev = self.upload("activations", x)?;
        let mut out_dev = self.alloc("rms_norm output", out.len())?;
        let stream = self.gpu.stream.clone();
        let w_dev = self.weight(wb, weight.ggml_type)?;
        let (rows, n32) = ((x.len() / n) as u32, n as u32);
        let cfg = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&f);
        b.arg(&x_dev)
            .arg(w_dev)
            .arg(&mut out_dev)
            .arg(&n32)
            .arg(&eps);
        // SAFETY: rms_norm(const float* x, const float* w, float* out, u32 n, float eps), one
        // block of 256 (≤ 1024, a power of two) per row of n.
        drv("launching rms_norm", unsafe { b.launch(cfg) })?;
        self.download("rms_norm output", &out_dev, out)
    }

    fn add(&mut self, acc: &mut [f32], x: &[f32]) -> OpResult<()> {
        self.binary("add", acc, x)
    }

    fn swiglu(&mut self, gate: &mut [f32], up: &[f32]) -> OpResult<()> {
        self.binary("swiglu", gate, up)
    }

    fn geglu(&mut self, gate: &mut [f32], up: &[f32]) -> OpResult<()> {
        self.binary("geglu", gate, up)
    }

    fn add_bias(&mut self, x: &mut [f32], bias: &TensorView<'_>) -> OpResult<()> {
        const OP: &str = "add_bias";
        let (bb, row) = add_bias_args(x.len(), bias)?;
        if x.is_empty() {
            return Ok(());
        }
        let f = self.gpu.function(Family::Elementwise, "add_bias")?;
        let mut x_dev = self.upload("activations", x)?;
        let (n, row32) = (x.len() as u64, row as u32);
        let stream = self.gpu.stream.clone();
        let b_dev = self.weight(bb, bias.ggml_type)?;
        let mut l = stream.launch_builder(&f);
        l.arg(&mut x_dev).arg(b_dev).arg(&n).arg(&row32);
        // SAFETY: add_bias(float* x, const float* bias, u64 n, u32 row), bias row long.
        drv(OP, unsafe { l.launch(grid_1d(n)) })?;
        self.download(OP, &x_dev, x)
    }

    fn scale(&mut self, x: &mut [f32], s: f32) -> OpResult<()> {
        if x.is_empty() {
            return Ok(());
        }
        let f = self.gpu.function(Family::Elementwise, "scale")?;
        let stream = self.gpu.stream.clone();
        let mut x_dev = self.upload("activations", x)?;
        let n = x.len() as u64;
        let mut l = stream.launch_builder(&f);
        l.arg(&mut x_dev).arg(&s).arg(&n);
        // SAFETY: scale(float* x, float s, u64 n).
        drv("scale", unsafe { l.launch(grid_1d(n)) })?;
        self.download("scale", &x_dev, x)
    }

    fn rope(
        &mut self,
        x: &mut [f32],
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams<'_>,
    ) -> OpResult<()> {
        const OP: &str = "rope";
        let Some(n_rot) = rope_args(x.len(), n_head, head_dim, positions.len(), p)? else {
            return Ok(());
        };
        let table = p.cos_sin_table(positions, n_rot);
        let f = self.gpu.function(Family::Rope, "rope")?;
        let stream = self.gpu.stream.clone();
        let mut x_dev = self.upload("activations", x)?;
        let table_dev = self.upload("rope cos/sin", &table)?;
        let (n_tokens, nh, hd, nr) = (
            positions.len() as u32,
            n_head as u32,
            head_dim as u32,
            p.n_rot,
        );
        let neox = u32::from(p.neox);
        let total = positions.len() as u64 * n_head as u64 * (n_rot / 2) as u64;
        let mut l = stream.launch_builder(&f);
        l.arg(&mut x_dev)
            .arg(&table_dev)
            .arg(&n_tokens)
            .arg(&nh)
            .arg(&hd)
            .arg(&nr)
            .arg(&neox);
        // SAFETY: rope(float* x, const float* cs, u32 n_tokens, u32 n_head, u32 head_dim,
        // u32 n_rot, u32 neox), x holding n_tokens × n_head × head_dim, cs n_tokens × n_rot.
        drv(OP, unsafe { l.launch(grid_1d(total)) })?;
        self.download(OP, &x_dev, x)
    }

    fn kv_create(&mut self, spec: KvSpec) -> OpResult<u64> {
        let stream = self.gpu.stream.clone();
        self.kv.create(spec, |n| {
            drv(
                "allocating the KV cache",
                stream.alloc_zeros::<u16>(n.max(1)),
            )
        })
    }

    fn kv_drop(&mut self, kv: u64) {
        self.kv.drop(kv);
    }

    fn kv_truncate(&mut self, kv: u64, n_pos: u32) -> OpResult<()> {
        self.kv.truncate(kv, n_pos)
    }

    fn attention(
        &mut self,
        kv: u64,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        p: &AttentionParams,
        out: &mut [f32],
    ) -> OpResult<()> {
        let lens = [q.len(), k.len(), v.len(), out.len()];
        let Some(span) = self
            .kv
            .check_attention(kv, p, ATT_MAX_HEAD_DIM as usize, lens)?
        else {
            return Ok(());
        };
        let (start, end) = (span.start, span.end);
        let (n_tokens, n_head, n_head_kv) =
            (p.n_tokens as usize, p.n_head as usize, p.n_head_kv as usize);
        let (dk, dv) = (p.head_dim_k as usize, p.head_dim_v as usize);
        let layer = p.layer as usize;
        let store = self.gpu.function(Family::Attention, "store_f16")?;
        let attend = self.gpu.function(Family::Attention, "attention")?;
        let q_dev = self.upload("queries", q)?;
        let k_dev = self.upload("keys", k)?;
        let v_dev = self.upload("values", v)?;
        let mut out_dev = self.alloc("attention output", out.len())?;
        let stream = self.gpu.stream.clone();
        let cache = self.kv.get_mut(kv)?;
        for (src, dst, d) in [
            (&k_dev, &mut cache.k[layer], dk),
            (&v_dev, &mut cache.v[layer], dv),
        ] {
            let (off, n) = (start * n_head_kv * d, n_tokens * n_head_kv * d);
            if n == 0 {
                continue;
            }
            let mut view = dst.slice_mut(off..off + n);
            let n64 = n as u64;
            let mut l = stream.launch_builder(&store);
            l.arg(src).arg(&mut view).arg(&n64);
            // SAFETY: store_f16(const float* src, u16* dst, u64 n): src holds n floats and the
            // view n elements of the cache (end ≤ n_ctx was checked).
            drv("storing into the KV cache", unsafe {
                l.launch(grid_1d(n64))
            })?;
        }
        cache.hold(layer, end);
        let (nh, nkv, dk32, dv32, start32) = (
            p.n_head,
            p.n_head_kv,
            p.head_dim_k,
            p.head_dim_v,
            p.start_pos,
        );
        let cfg = LaunchConfig {
            grid_dim: (p.n_head, p.n_tokens, 1),
            block_dim: (32 * ATT_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        // Softmax scratch: the positions the last token sees, per (token, head).
        let span = end as u32;
        // SAFETY: each (token, head) writes its scores before reading them back.
        let mut scores = drv("allocating attention scores", unsafe {
            stream.alloc::<f32>(n_tokens * n_head * end)
        })?;
        let mut l = stream.launch_builder(&attend);
        l.arg(&q_dev)
            .arg(&cache.k[layer])
            .arg(&cache.v[layer])
            .arg(&mut out_dev)
            .arg(&mut scores)
            .arg(&nh)
            .arg(&nkv)
            .arg(&dk32)
            .arg(&dv32)
            .arg(&start32)
            .arg(&p.sliding_window)
            .arg(&p.scale)
            .arg(&p.softcap)
            .arg(&span);
        // SAFETY: attention(const float* q, const u16* k, const u16* v, float* out,
        // float* scores, u32 ×6, float scale, float softcap, u32 span); the cache layer holds
        // positions ≤ start + n_tokens - 1 = span - 1, scores n_tokens × n_head × span, head
        // sizes ≤ ATT_MAX_HEAD_DIM, n_head a multiple of n_head_kv (all checked).
        drv("launching attention", unsafe { l.launch(cfg) })?;
        self.download("attention output", &out_dev, out)
    }
}
