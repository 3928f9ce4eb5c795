//! The backend operations on the GPU, host side: argument checks (the CPU backend's) and
//! the launches.
//!
//! Device-buffer ABI (v5): activations live in VRAM buffers named by id ([`Buf`] ranges,
//! passed to the kernels as views at their offsets). Every launch and every small argument
//! copy (row ids, RoPE tables) is queued on the one stream, in order, and nothing waits
//! until `download`: one stream synchronisation and a device-to-host copy. Weights (cached
//! by mapping address) and the KV cache stay in VRAM.

use std::collections::HashMap;

use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, Buf, KvSpec, RopeParams, TensorView, TransferCounts,
};

use crate::device::{drv, grid_1d, Gpu};
use crate::formats::{Activation, WeightShape};
use crate::kernels::{Family, ATT_MAX_HEAD_DIM, ATT_WARPS, MATMUL_TOKENS, MATMUL_WARPS};
use prima_gpu_support::backend::GpuOps;
use prima_gpu_support::bufs::{apart, Buffers};
use prima_gpu_support::checks::{
    add_bias_args, expect_len, mul, rms_norm_args, rope_args, OpResult,
};
use prima_gpu_support::kv::KvCaches;

type WeightKey = (usize, usize, u32);

/// Everything the backend keeps on the GPU.
pub struct State {
    pub gpu: Gpu,
    /// Weights in their stored layout, by (mapping address, length, type): the views are
    /// slices of a read-only mapping that outlives the backend's use of it.
    weights: HashMap<WeightKey, CudaSlice<u8>>,
    pub weight_bytes: u64,
    /// Activation buffers, by id.
    bufs: Buffers<CudaSlice<f32>>,
    kv: KvCaches<CudaSlice<u16>>,
    counts: TransferCounts,
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

/// The elements of `b` within its buffer, as a view the kernels take.
fn view<'a>(buf: &'a CudaSlice<f32>, b: Buf) -> CudaView<'a, f32> {
    let from = b.offset as usize;
    buf.slice(from..from + b.len())
}

impl State {
    pub fn new(gpu: Gpu) -> State {
        State {
            gpu,
            weights: HashMap::new(),
            weight_bytes: 0,
            bufs: Buffers::default(),
            kv: KvCaches::default(),
            counts: TransferCounts::default(),
        }
    }

    /// Uploads the weight on first use; its key in `weights`.
    fn weight(&mut self, bytes: &[u8], ty: u32) -> OpResult<WeightKey> {
        let key = (bytes.as_ptr() as usize, bytes.len(), ty);
        if !self.weights.contains_key(&key) {
            let dev = drv("uploading a weight", self.gpu.stream.clone_htod(bytes))?;
            self.weight_bytes += bytes.len() as u64;
            self.weights.insert(key, dev);
        }
        Ok(key)
    }

    /// A small per-operation argument (row ids, a RoPE table) copied to the GPU, queued.
    fn param<T: cudarc::driver::DeviceRepr>(
        &mut self,
        what: &str,
        host: &[T],
    ) -> OpResult<CudaSlice<T>> {
        self.counts.param_bytes += std::mem::size_of_val(host) as u64;
        drv(
            &format!("uploading {what}"),
            self.gpu.stream.clone_htod(host),
        )
    }

    fn alloc(&self, what: &str, n: usize) -> OpResult<CudaSlice<f32>> {
        // SAFETY: every element is written by the kernel before it is read.
        drv(&format!("allocating {what}"), unsafe {
            self.gpu.stream.alloc::<f32>(n.max(1))
        })
    }

    /// `x` (`n` floats, whole blocks of `act`) quantized as the CPU backend quantizes a
    /// matmul's activations, once per product.
    fn quantize_activations(&mut self, act: Activation, x: Buf) -> OpResult<QuantizedActivations> {
        let kernel = act
            .quantize_kernel()
            .ok_or("float activations are not quantized")?;
        let f = self.gpu.function(Family::Quantize, kernel)?;
        let n = x.len();
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
        let x_view = view(self.bufs.get("matmul", "x", x)?, x);
        let mut b = stream.launch_builder(&f);
        b.arg(&x_view).arg(&mut q).arg(&mut d);
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

    /// `kernel(a, b, n)` over two equal-length ranges, `a` updated in place.
    fn binary(&mut self, op: &'static str, a: Buf, b: Buf) -> OpResult<()> {
        expect_len(op, "second operand length", b.len(), a.len())?;
        if a.is_empty() {
            return Ok(());
        }
        apart(op, a, &[b])?;
        let f = self.gpu.function(Family::Elementwise, op)?;
        let stream = self.gpu.stream.clone();
        let n = a.len() as u64;
        self.bufs.with_out(op, a, |a_buf, bufs| {
            let b_view = view(bufs.get(op, "second operand", b)?, b);
            let from = a.offset as usize;
            let mut a_view = a_buf.slice_mut(from..from + a.len());
            let mut l = stream.launch_builder(&f);
            l.arg(&mut a_view).arg(&b_view).arg(&n);
            // SAFETY: op(float* a, const float* b, u64 n) with both n long.
            drv(op, unsafe { l.launch(grid_1d(n)) }).map(|_| ())
        })
    }
}

impl GpuOps for State {
    const NAME: &'static str = "cuda";

    fn buf_create(&mut self, len: usize) -> OpResult<u64> {
        let buf = drv(
            "allocating activations",
            self.gpu.stream.alloc_zeros::<f32>(len.max(1)),
        )?;
        Ok(self.bufs.insert(buf, len as u64))
    }

    fn buf_drop(&mut self, id: u64) {
        // Freed in stream order, after the launches queued on it.
        self.bufs.remove(id);
    }

    fn upload(&mut self, dst: Buf, src: &[f32]) -> OpResult<()> {
        const OP: &str = "upload";
        expect_len(OP, "source length", src.len(), dst.len())?;
        let stream = self.gpu.stream.clone();
        let buf = self.bufs.get_mut(OP, "destination", dst)?;
        self.counts.uploads += 1;
        if src.is_empty() {
            return Ok(());
        }
        self.counts.bytes_up += std::mem::size_of_val(src) as u64;
        let from = dst.offset as usize;
        let mut v = buf.slice_mut(from..from + dst.len());
        // Queued after the launches so far (the host slice is staged before this returns).
        drv("uploading activations", stream.memcpy_htod(src, &mut v))
    }

    fn download(&mut self, src: Buf, dst: &mut [f32]) -> OpResult<()> {
        const OP: &str = "download";
        expect_len(OP, "destination length", dst.len(), src.len())?;
        let stream = self.gpu.stream.clone();
        let buf = self.bufs.get(OP, "source", src)?;
        self.counts.downloads += 1;
        self.counts.bytes_down += std::mem::size_of_val(dst) as u64;
        if !dst.is_empty() {
            drv(
                "downloading activations",
                stream.memcpy_dtoh(&view(buf, src), dst),
            )?;
        }
        drv("waiting for the GPU", stream.synchronize())?;
        self.counts.waits += 1;
        Ok(())
    }

    fn transfers(&self) -> TransferCounts {
        self.counts
    }

    fn get_rows(&mut self, table: &TensorView<'_>, ids: &[u32], out: Buf) -> OpResult<()> {
        const OP: &str = "get_rows";
        let shape = WeightShape::for_get_rows("CUDA", table, ids, out.len())?;
        if ids.is_empty() || shape.cols == 0 {
            return Ok(());
        }
        let f = self
            .gpu
            .function(shape.format.family.into(), shape.format.get_rows)?;
        let ids_dev = self.param("row ids", ids)?;
        let n_ids = ids.len() as u32;
        let stream = self.gpu.stream.clone();
        let key = self.weight(table.data.as_slice(), table.ggml_type)?;
        let w = &self.weights[&key];
        let chunks = shape.cols / 32;
        let cfg = LaunchConfig {
            grid_dim: (chunks.div_ceil(128), n_ids, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let from = out.offset as usize;
        let out_buf = self.bufs.get_mut(OP, "out", out)?;
        let mut out_view = out_buf.slice_mut(from..from + out.len());
        let mut b = stream.launch_builder(&f);
        b.arg(w)
            .arg(&ids_dev)
            .arg(&mut out_view)
            .arg(&shape.cols)
            .arg(&shape.row_bytes)
            .arg(&n_ids);
        // SAFETY: get_rows_<fmt>(const u8*, const u32*, float*, u32, u64, u32); the weight holds
        // `rows` rows of `row_bytes`, every id < rows, out holds n_ids × cols floats.
        drv("launching get_rows", unsafe { b.launch(cfg) })?;
        Ok(())
    }

    fn matmul(&mut self, w: &TensorView<'_>, x: Buf, n_tokens: usize, out: Buf) -> OpResult<()> {
        const OP: &str = "matmul";
        let shape = WeightShape::for_matmul("CUDA", w, x.len(), n_tokens, out.len())?;
        if n_tokens == 0 || shape.rows == 0 {
            return Ok(());
        }
        apart(OP, out, &[x])?;
        self.bufs.get(OP, "x", x)?;
        let f = self
            .gpu
            .function(shape.format.family.into(), shape.format.matmul)?;
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
        let key = self.weight(w.data.as_slice(), w.ggml_type)?;
        let act = shape.format.activation;
        let quantized = match act {
            Activation::Float => None,
            act => Some(self.quantize_activations(act, x)?),
        };
        let w_dev = &self.weights[&key];
        self.bufs.with_out(OP, out, |out_buf, bufs| {
            let from = out.offset as usize;
            let mut out_view = out_buf.slice_mut(from..from + out.len());
            match &quantized {
                None => {
                    let x_view = view(bufs.get(OP, "x", x)?, x);
                    let mut b = stream.launch_builder(&f);
                    b.arg(w_dev)
                        .arg(&x_view)
                        .arg(&mut out_view)
                        .arg(&shape.cols)
                        .arg(&shape.rows)
                        .arg(&shape.row_bytes)
                        .arg(&n);
                    // SAFETY: matmul_<fmt>(const u8* w, const float* x, float* out, u32 cols,
                    // u32 rows, u64 row_bytes, u32 n_tokens), x n_tokens × cols, out
                    // n_tokens × rows.
                    drv("launching matmul", unsafe { b.launch(cfg) })?;
                }
                Some(a) => {
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
                    b.arg(&mut out_view)
                        .arg(&shape.cols)
                        .arg(&shape.rows)
                        .arg(&shape.row_bytes)
                        .arg(&n);
                    // SAFETY: matmul_<fmt>(const u8* w, const i8* q, const float* d,
                    // const float* s, const short* bsums, float* out, u32 cols, u32 rows,
                    // u64 row_bytes, u32 n_tokens): q n_tokens × cols quants, d (and s) one
                    // per activation block, bsums one per 16 elements (those the kind has;
                    // the kernel reads only those), out n_tokens × rows.
                    drv("launching matmul", unsafe { b.launch(cfg) })?;
                }
            }
            Ok(())
        })
    }

    fn rms_norm(&mut self, x: Buf, weight: &TensorView<'_>, eps: f32, out: Buf) -> OpResult<()> {
        const OP: &str = "rms_norm";
        let (wb, n) = rms_norm_args(x.len(), weight, out.len())?;
        if x.is_empty() {
            return Ok(());
        }
        apart(OP, out, &[x])?;
        let f = self.gpu.function(Family::Elementwise, "rms_norm")?;
        let stream = self.gpu.stream.clone();
        let key = self.weight(wb, weight.ggml_type)?;
        let w_dev = &self.weights[&key];
        let (rows, n32) = ((x.len() / n) as u32, n as u32);
        let cfg = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.bufs.with_out(OP, out, |out_buf, bufs| {
            let x_view = view(bufs.get(OP, "x", x)?, x);
            let from = out.offset as usize;
            let mut out_view = out_buf.slice_mut(from..from + out.len());
            let mut b = stream.launch_builder(&f);
            b.arg(&x_view)
                .arg(w_dev)
                .arg(&mut out_view)
                .arg(&n32)
                .arg(&eps);
            // SAFETY: rms_norm(const float* x, const float* w, float* out, u32 n, float eps),
            // one block of 256 (≤ 1024, a power of two) per row of n.
            drv("launching rms_norm", unsafe { b.launch(cfg) }).map(|_| ())
        })
    }

    fn add(&mut self, acc: Buf, x: Buf) -> OpResult<()> {
        self.binary("add", acc, x)
    }

    fn swiglu(&mut self, gate: Buf, up: Buf) -> OpResult<()> {
        self.binary("swiglu", gate, up)
    }

    fn geglu(&mut self, gate: Buf, up: Buf) -> OpResult<()> {
        self.binary("geglu", gate, up)
    }

    fn add_bias(&mut self, x: Buf, bias: &TensorView<'_>) -> OpResult<()> {
        const OP: &str = "add_bias";
        let (bb, row) = add_bias_args(x.len(), bias)?;
        if x.is_empty() {
            return Ok(());
        }
        let f = self.gpu.function(Family::Elementwise, "add_bias")?;
        let (n, row32) = (x.len() as u64, row as u32);
        let stream = self.gpu.stream.clone();
        let key = self.weight(bb, bias.ggml_type)?;
        let b_dev = &self.weights[&key];
        let from = x.offset as usize;
        let x_buf = self.bufs.get_mut(OP, "x", x)?;
        let mut x_view = x_buf.slice_mut(from..from + x.len());
        let mut l = stream.launch_builder(&f);
        l.arg(&mut x_view).arg(b_dev).arg(&n).arg(&row32);
        // SAFETY: add_bias(float* x, const float* bias, u64 n, u32 row), bias row long.
        drv(OP, unsafe { l.launch(grid_1d(n)) })?;
        Ok(())
    }

    fn scale(&mut self, x: Buf, s: f32) -> OpResult<()> {
        if x.is_empty() {
            return Ok(());
        }
        let f = self.gpu.function(Family::Elementwise, "scale")?;
        let stream = self.gpu.stream.clone();
        let n = x.len() as u64;
        let from = x.offset as usize;
        let x_buf = self.bufs.get_mut("scale", "x", x)?;
        let mut x_view = x_buf.slice_mut(from..from + x.len());
        let mut l = stream.launch_builder(&f);
        l.arg(&mut x_view).arg(&s).arg(&n);
        // SAFETY: scale(float* x, float s, u64 n).
        drv("scale", unsafe { l.launch(grid_1d(n)) })?;
        Ok(())
    }

    fn rope(
        &mut self,
        x: Buf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        p: &RopeParams<'_>,
    ) -> OpResult<()> {
        const OP: &str = "rope";
        let Some(n_rot) = rope_args(x.len(), n_head, head_dim, positions.len(), p)? else {
            return Ok(());
        };
        self.bufs.get(OP, "x", x)?;
        let table = p.cos_sin_table(positions, n_rot);
        let f = self.gpu.function(Family::Rope, "rope")?;
        let stream = self.gpu.stream.clone();
        let table_dev = self.param("rope cos/sin", &table)?;
        let (n_tokens, nh, hd, nr) = (
            positions.len() as u32,
            n_head as u32,
            head_dim as u32,
            p.n_rot,
        );
        let neox = u32::from(p.neox);
        let total = positions.len() as u64 * n_head as u64 * (n_rot / 2) as u64;
        let from = x.offset as usize;
        let x_buf = self.bufs.get_mut(OP, "x", x)?;
        let mut x_view = x_buf.slice_mut(from..from + x.len());
        let mut l = stream.launch_builder(&f);
        l.arg(&mut x_view)
            .arg(&table_dev)
            .arg(&n_tokens)
            .arg(&nh)
            .arg(&hd)
            .arg(&nr)
            .arg(&neox);
        // SAFETY: rope(float* x, const float* cs, u32 n_tokens, u32 n_head, u32 head_dim,
        // u32 n_rot, u32 neox), x holding n_tokens × n_head × head_dim, cs n_tokens × n_rot.
        drv(OP, unsafe { l.launch(grid_1d(total)) })?;
        Ok(())
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

    /// One span after another: its keys and values stored into its cache, then a launch of
    /// (head, token) blocks over its rows of `q` and `out`.
    fn attention_spans(
        &mut self,
        spans: &[AttentionSpan],
        q: Buf,
        k: Buf,
        v: Buf,
        p: &AttentionParams,
        out: Buf,
    ) -> OpResult<()> {
        const OP: &str = "attention";
        let lens = [q.len(), k.len(), v.len(), out.len()];
        let plans = self
            .kv
            .plan_spans(spans, p, ATT_MAX_HEAD_DIM as usize, lens)?;
        if plans.is_empty() {
            return Ok(());
        }
        apart(OP, out, &[q, k, v])?;
        for (what, b) in [("q", q), ("k", k), ("v", v)] {
            self.bufs.get(OP, what, b)?;
        }
        let (n_head, n_head_kv) = (p.n_head as usize, p.n_head_kv as usize);
        let (dk, dv) = (p.head_dim_k as usize, p.head_dim_v as usize);
        let layer = p.layer as usize;
        let store = self.gpu.function(Family::Attention, "store_f16")?;
        let attend = self.gpu.function(Family::Attention, "attention")?;
        let stream = self.gpu.stream.clone();
        for plan in plans {
            let (n_tokens, start, end) = (plan.n_tokens, plan.positions.start, plan.positions.end);
            let rows = |b: Buf, width: usize| b.slice(plan.row0 * width, n_tokens * width);
            let (qs, ks, vs) = (
                rows(q, n_head * dk),
                rows(k, n_head_kv * dk),
                rows(v, n_head_kv * dv),
            );
            let os = rows(out, n_head * dv);
            let cache = self.kv.get_mut(plan.kv)?;
            for (src, dst, d) in [(ks, &mut cache.k[layer], dk), (vs, &mut cache.v[layer], dv)] {
                let (off, n) = (start * n_head_kv * d, n_tokens * n_head_kv * d);
                if n == 0 {
                    continue;
                }
                let src_view = view(self.bufs.get(OP, "k/v", src)?, src);
                let mut dst_view = dst.slice_mut(off..off + n);
                let n64 = n as u64;
                let mut l = stream.launch_builder(&store);
                l.arg(&src_view).arg(&mut dst_view).arg(&n64);
                // SAFETY: store_f16(const float* src, u16* dst, u64 n): src holds n floats and
                // the view n elements of the cache (end ≤ n_ctx was checked).
                drv("storing into the KV cache", unsafe {
                    l.launch(grid_1d(n64))
                })?;
            }
            cache.hold(layer, end);
            let cfg = LaunchConfig {
                grid_dim: (p.n_head, n_tokens as u32, 1),
                block_dim: (32 * ATT_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            // Softmax scratch: the positions the last token sees, per (token, head).
            let span = end as u32;
            let start32 = start as u32;
            // SAFETY: each (token, head) writes its scores before reading them back.
            let mut scores = drv("allocating attention scores", unsafe {
                stream.alloc::<f32>(mul(OP, n_tokens * n_head, end)?.max(1))
            })?;
            let (kc, vc) = (&cache.k[layer], &cache.v[layer]);
            self.bufs.with_out(OP, os, |out_buf, bufs| {
                let q_view = view(bufs.get(OP, "q", qs)?, qs);
                let from = os.offset as usize;
                let mut out_view = out_buf.slice_mut(from..from + os.len());
                let mut l = stream.launch_builder(&attend);
                l.arg(&q_view)
                    .arg(kc)
                    .arg(vc)
                    .arg(&mut out_view)
                    .arg(&mut scores)
                    .arg(&p.n_head)
                    .arg(&p.n_head_kv)
                    .arg(&p.head_dim_k)
                    .arg(&p.head_dim_v)
                    .arg(&start32)
                    .arg(&p.sliding_window)
                    .arg(&p.scale)
                    .arg(&p.softcap)
                    .arg(&span);
                // SAFETY: attention(const float* q, const u16* k, const u16* v, float* out,
                // float* scores, u32 ×6, float scale, float softcap, u32 span); the cache
                // layer holds positions ≤ start + n_tokens - 1 = span - 1, scores
                // n_tokens × n_head × span, head sizes ≤ ATT_MAX_HEAD_DIM, n_head a multiple
                // of n_head_kv (all checked).
                drv("launching attention", unsafe { l.launch(cfg) }).map(|_| ())
            })?;
        }
        Ok(())
    }
}
