//! The backend operations on the GPU, host side: argument checks (the CPU backend's), the
//! uploads, the dispatches and the read-back.
//!
//! The host-slice ABI (v2): every operation writes its activations into scratch buffers
//! (grown, never shrunk, reused by every later operation), records its dispatches in one
//! command buffer, submits it and waits for the result. Weights are uploaded once, in their
//! stored blocks, and cached by mapping address; the KV cache lives on the GPU.

use std::collections::HashMap;

use prima_abi::backend::{AttentionParams, KvSpec, RopeParams, TensorView};
use wgpu::util::DeviceExt;

use crate::device::Gpu;
use crate::formats::{Activation, WeightShape};
use crate::kernels::{ATT_MAX_HEAD_DIM, MATMUL_TOKENS_FLOAT, MATMUL_TOKENS_QUANT, WG};
use prima_gpu_support::backend::GpuOps;
use prima_gpu_support::checks::{
    add_bias_args, expect_len, mul, rms_norm_args, rope_args, OpResult,
};
use prima_gpu_support::kv::KvCaches;

/// The scratch buffers, one per role an operation's data plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    In0,
    In1,
    In2,
    Out,
    /// A matmul's quantized activations.
    Act,
    Ids,
    RopeTable,
    Scores,
}

/// Whole rows `row0 .. row0 + rows` of a weight in one buffer (one binding).
struct Part {
    buf: wgpu::Buffer,
    row0: u32,
    rows: u32,
}

/// Everything the backend keeps on the GPU.
pub struct State {
    pub gpu: Gpu,
    /// Weights in their stored layout, by (mapping address, length, type): the views are
    /// slices of a read-only mapping that outlives the backend's use of it.
    weights: HashMap<(usize, usize, u32), Vec<Part>>,
    pub weight_bytes: u64,
    scratch: HashMap<Slot, wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
    kv: KvCaches<wgpu::Buffer>,
    /// Bytes one binding may hold: the device's limit.
    binding_limit: u64,
    /// Bytes one weight part may hold: the binding limit, lower in tests.
    part_limit: u64,
    /// Matmul with one invocation per weight row (`rowmatmul_*`, for CPU adapters) rather
    /// than a workgroup per row (`matmul_*`, for GPUs). The same bits either way.
    pub row_per_invocation: bool,
}

fn u32_of(op: &str, what: &str, v: usize) -> OpResult<u32> {
    u32::try_from(v).map_err(|_| format!("{op}: {what} {v} exceeds the GPU's 32-bit indices"))
}

impl State {
    /// `part_limit` lowers the bytes per weight binding below the device's (tests).
    pub fn new(gpu: Gpu, part_limit: Option<u64>) -> State {
        let gpu_is_cpu = gpu.info.device_type == wgpu::DeviceType::Cpu;
        let l = &gpu.limits;
        // Byte offsets in the kernels are u32.
        let binding_limit = l
            .max_storage_buffer_binding_size
            .min(l.max_buffer_size)
            .min(1 << 31);
        let part_limit = part_limit.map_or(binding_limit, |v| v.clamp(64, binding_limit));
        State {
            gpu,
            weights: HashMap::new(),
            weight_bytes: 0,
            scratch: HashMap::new(),
            staging: None,
            kv: KvCaches::default(),
            binding_limit,
            part_limit,
            row_per_invocation: gpu_is_cpu,
        }
    }

    /// The weight's GPU copy in parts of whole rows, each within one binding; uploaded on
    /// first use. The buffers are padded by a word (see weights.wgsl).
    fn weight(
        &mut self,
        bytes: &[u8],
        ty: u32,
        row_bytes: u64,
        rows: u32,
    ) -> OpResult<Vec<(wgpu::Buffer, u32, u32)>> {
        let key = (bytes.as_ptr() as usize, bytes.len(), ty);
        if !self.weights.contains_key(&key) {
            let room = self.part_limit - 8;
            if row_bytes > room {
                return Err(format!(
                    "a weight row of {row_bytes} bytes exceeds the GPU's binding size {}",
                    self.part_limit
                ));
            }
            let per_part = (room / row_bytes.max(1)).clamp(1, rows.max(1) as u64) as u32;
            let mut parts = Vec::new();
            let mut row0 = 0u32;
            while row0 < rows.max(1) {
                let n = per_part.min(rows.max(1) - row0);
                let (from, to) = (
                    (row0 as u64 * row_bytes) as usize,
                    ((row0 + n) as u64 * row_bytes).min(bytes.len() as u64) as usize,
                );
                let data = &bytes[from..to];
                let size = ((data.len() as u64 + 4).div_ceil(4) * 4).max(16);
                let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("weight"),
                    size,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: true,
                });
                buf.slice(..)
                    .get_mapped_range_mut()
                    .map_err(|e| format!("mapping a weight buffer: {e}"))?
                    .slice(..data.len())
                    .copy_from_slice(data);
                buf.unmap();
                self.weight_bytes += data.len() as u64;
                parts.push(Part { buf, row0, rows: n });
                row0 += n;
            }
            self.weights.insert(key, parts);
        }
        Ok(self.weights[&key]
            .iter()
            .map(|p| (p.buf.clone(), p.row0, p.rows))
            .collect())
    }

    /// The scratch buffer of `slot`, at least `bytes` long.
    fn scratch(&mut self, slot: Slot, bytes: u64) -> OpResult<wgpu::Buffer> {
        if let Some(b) = self.scratch.get(&slot) {
            if b.size() >= bytes {
                return Ok(b.clone());
            }
        }
        if bytes > self.binding_limit {
            return Err(format!(
                "{bytes} bytes of activations exceed the GPU's binding size {}",
                self.binding_limit
            ));
        }
        // Grown geometrically so a growing context reallocates rarely.
        let size = bytes
            .max(256)
            .next_power_of_two()
            .min(self.binding_limit.max(bytes))
            .div_ceil(4)
            * 4;
        let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("scratch"),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        self.scratch.insert(slot, buf.clone());
        Ok(buf)
    }

    /// `data` written into the scratch buffer of `slot` (applied at the next submit).
    fn upload<T: bytemuck::Pod>(&mut self, slot: Slot, data: &[T]) -> OpResult<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buf = self.scratch(slot, bytes.len() as u64)?;
        if !bytes.is_empty() {
            self.gpu.queue.write_buffer(&buf, 0, bytes);
        }
        Ok(buf)
    }

    /// Workgroup counts for `groups` workgroups in one dimension, split over y where x
    /// would exceed the device's per-dimension limit (the kernels' `flat_id`).
    fn grid(&self, groups: u64) -> OpResult<[u32; 2]> {
        let max = self.gpu.limits.max_compute_workgroups_per_dimension.max(1) as u64;
        let x = groups.clamp(1, max);
        let y = groups.div_ceil(x).max(1);
        if y > max {
            return Err(format!(
                "{groups} workgroups exceed the GPU's dispatch limits"
            ));
        }
        Ok([x as u32, y as u32])
    }

    fn grid_1d(&self, items: u64) -> OpResult<[u32; 3]> {
        let [x, y] = self.grid(items.div_ceil(WG as u64))?;
        Ok([x, y, 1])
    }

    /// Records one dispatch of `kernel` with `params` (its uniform `P`, 4-byte fields) at
    /// binding 0 and `bufs` at their bindings.
    fn dispatch(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        kernel: &str,
        params: &[u32],
        bufs: &[(u32, &wgpu::Buffer)],
        groups: [u32; 3],
    ) -> OpResult<()> {
        let pipeline = self.gpu.pipeline(kernel)?;
        let mut bytes: Vec<u8> = bytemuck::cast_slice(params).to_vec();
        bytes.resize(bytes.len().div_ceil(16).max(1) * 16, 0);
        let device = &self.gpu.device;
        let uniform = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(kernel),
            contents: &bytes,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        for (binding, buf) in bufs {
            entries.push(wgpu::BindGroupEntry {
                binding: *binding,
                resource: buf.as_entire_binding(),
            });
        }
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(kernel),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(kernel),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        Ok(())
    }

    fn encoder(&self) -> wgpu::CommandEncoder {
        self.gpu
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// Submits `enc`, waits, and copies the first `out.len()` floats of `src` into `out`.
    fn finish(
        &mut self,
        mut enc: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        out: &mut [f32],
    ) -> OpResult<()> {
        let bytes = (out.len() * 4) as u64;
        let staging = match &self.staging {
            Some(s) if s.size() >= bytes => s.clone(),
            _ => {
                let s = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("read-back"),
                    size: bytes.max(256).next_power_of_two(),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                self.staging = Some(s.clone());
                s
            }
        };
        if bytes > 0 {
            enc.copy_buffer_to_buffer(src, 0, &staging, 0, bytes);
        }
        self.gpu.queue.submit([enc.finish()]);
        if bytes == 0 {
            return Ok(());
        }
        let slice = staging.slice(0..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("waiting for the GPU: {e}"))?;
        rx.recv()
            .map_err(|_| "the GPU read-back was dropped".to_string())?
            .map_err(|e| format!("reading the result back: {e}"))?;
        {
            let data = slice
                .get_mapped_range()
                .map_err(|e| format!("mapping the read-back buffer: {e}"))?;
            out.copy_from_slice(bytemuck::cast_slice(&data));
        }
        staging.unmap();
        Ok(())
    }

    /// `kernel` (binary.wgsl) over `a`, with `b` repeating every `period` elements.
    fn binary(
        &mut self,
        kernel: &'static str,
        a: &mut [f32],
        b: Option<&[f32]>,
        bias: Option<wgpu::Buffer>,
        period: usize,
    ) -> OpResult<()> {
        if a.is_empty() {
            return Ok(());
        }
        let n = u32_of(kernel, "length", a.len())?;
        let a_buf = self.upload(Slot::In0, a)?;
        let b_buf = match (b, bias) {
            (Some(b), _) => self.upload(Slot::In1, b)?,
            (None, Some(buf)) => buf,
            (None, None) => return Err(format!("{kernel}: no second operand")),
        };
        let groups = self.grid_1d(n as u64)?;
        let mut enc = self.encoder();
        self.dispatch(
            &mut enc,
            kernel,
            &[n, period as u32],
            &[(1, &a_buf), (2, &b_buf)],
            groups,
        )?;
        self.finish(enc, &a_buf, a)
    }
}

impl GpuOps for State {
    const NAME: &'static str = "wgpu";

    /// wgpu reports invalid use and exhausted memory through error scopes, not return
    /// values: both are collected around each operation.
    fn guarded<T>(&mut self, op: &str, f: impl FnOnce(&mut Self) -> OpResult<T>) -> OpResult<T> {
        let oom = self
            .gpu
            .device
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self
            .gpu
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let r = f(self);
        let invalid = pollster::block_on(invalid.pop());
        let oom = pollster::block_on(oom.pop());
        match (r, invalid.or(oom)) {
            (Ok(_), Some(e)) => Err(format!("{op}: GPU error: {e}")),
            (r, _) => r,
        }
    }

    fn get_rows(&mut self, table: &TensorView<'_>, ids: &[u32], out: &mut [f32]) -> OpResult<()> {
        const OP: &str = "get_rows";
        let shape = WeightShape::for_get_rows("wgpu", table, ids, out.len())?;
        if ids.is_empty() || shape.cols == 0 {
            return Ok(());
        }
        let n = u32_of(OP, "output size", out.len())?;
        let kernel = format!("get_rows_{}", shape.format.kernel);
        let parts = self.weight(
            table.data.as_slice(),
            table.ggml_type,
            shape.row_bytes,
            shape.rows,
        )?;
        let ids_buf = self.upload(Slot::Ids, ids)?;
        let out_buf = self.scratch(Slot::Out, out.len() as u64 * 4)?;
        let groups = self.grid_1d(n as u64)?;
        let mut enc = self.encoder();
        for (buf, row0, rows) in &parts {
            let params = [
                shape.cols,
                shape.row_bytes as u32,
                ids.len() as u32,
                *row0,
                *rows,
            ];
            self.dispatch(
                &mut enc,
                &kernel,
                &params,
                &[(1, buf), (2, &ids_buf), (3, &out_buf)],
                groups,
            )?;
        }
        self.finish(enc, &out_buf, out)
    }

    fn matmul(
        &mut self,
        w: &TensorView<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) -> OpResult<()> {
        const OP: &str = "matmul";
        let shape = WeightShape::for_matmul("wgpu", w, x.len(), n_tokens, out.len())?;
        if n_tokens == 0 || shape.rows == 0 {
            return Ok(());
        }
        u32_of(OP, "output size", out.len())?;
        let n = u32_of(OP, "n_tokens", n_tokens)?;
        let act = shape.format.activation;
        let kernel = if self.row_per_invocation {
            format!("rowmatmul_{}", shape.format.kernel)
        } else {
            format!("matmul_{}", shape.format.kernel)
        };
        let parts = self.weight(w.data.as_slice(), w.ggml_type, shape.row_bytes, shape.rows)?;
        let x_buf = self.upload(Slot::In0, x)?;
        let out_buf = self.scratch(Slot::Out, out.len() as u64 * 4)?;
        let mut enc = self.encoder();
        let (input, extra, per_group) = match act {
            Activation::Float => (x_buf, [0u32; 2], MATMUL_TOKENS_FLOAT),
            _ => {
                // Quants (4 per word), then a scale per block, then Q8_1's sums (one per
                // block) or Q8_K's (one per 16 elements).
                let elems = u32_of(OP, "activation size", x.len())?;
                let n_blocks = elems / act.block_elems() as u32;
                let d_off = elems / 4;
                let (s_off, s_len) = match act {
                    Activation::Q8_1 => (d_off + n_blocks, n_blocks),
                    Activation::Q8K => (d_off + n_blocks, elems / 16),
                    _ => (d_off, 0),
                };
                let words = (s_off + s_len).max(d_off + n_blocks) as u64;
                let act_buf = self.scratch(Slot::Act, words * 4)?;
                let quantize = act
                    .quantize_kernel()
                    .ok_or("float activations are not quantized")?;
                let groups = self.grid_1d(n_blocks as u64)?;
                self.dispatch(
                    &mut enc,
                    quantize,
                    &[n_blocks, d_off, s_off],
                    &[(1, &x_buf), (2, &act_buf)],
                    groups,
                )?;
                (act_buf, [d_off, s_off], MATMUL_TOKENS_QUANT)
            }
        };
        let z = n.div_ceil(per_group);
        if z > self.gpu.limits.max_compute_workgroups_per_dimension {
            return Err(format!(
                "{OP}: {n_tokens} tokens exceed the GPU's dispatch limits"
            ));
        }
        for (buf, row0, rows) in &parts {
            let groups = if self.row_per_invocation {
                rows.div_ceil(WG)
            } else {
                *rows
            };
            let [gx, gy] = self.grid(groups as u64)?;
            // The last field is `zero` of the row-per-invocation quantized kernel.
            let params = [
                shape.cols,
                *rows,
                shape.row_bytes as u32,
                n,
                *row0,
                shape.rows,
                extra[0],
                extra[1],
                0,
            ];
            let params = if act == Activation::Float {
                &params[..6]
            } else {
                &params[..]
            };
            self.dispatch(
                &mut enc,
                &kernel,
                params,
                &[(1, buf), (2, &input), (3, &out_buf)],
                [gx, gy, z],
            )?;
        }
        self.finish(enc, &out_buf, out)
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
        u32_of("rms_norm", "length", x.len())?;
        let rows = (x.len() / n) as u32;
        let w = self.weight(wb, weight.ggml_type, wb.len() as u64, 1)?;
        let x_buf = self.upload(Slot::In0, x)?;
        let out_buf = self.scratch(Slot::Out, out.len() as u64 * 4)?;
        let [gx, gy] = self.grid(rows as u64)?;
        let mut enc = self.encoder();
        let params = [n as u32, eps.to_bits(), rows];
        self.dispatch(
            &mut enc,
            "rms_norm",
            &params,
            &[(1, &x_buf), (2, &w[0].0), (3, &out_buf)],
            [gx, gy, 1],
        )?;
        self.finish(enc, &out_buf, out)
    }

    fn add(&mut self, acc: &mut [f32], x: &[f32]) -> OpResult<()> {
        expect_len("add", "second operand length", x.len(), acc.len())?;
        self.binary("add", acc, Some(x), None, x.len())
    }

    fn swiglu(&mut self, gate: &mut [f32], up: &[f32]) -> OpResult<()> {
        expect_len("swiglu", "second operand length", up.len(), gate.len())?;
        self.binary("swiglu", gate, Some(up), None, up.len())
    }

    fn geglu(&mut self, gate: &mut [f32], up: &[f32]) -> OpResult<()> {
        expect_len("geglu", "second operand length", up.len(), gate.len())?;
        self.binary("geglu", gate, Some(up), None, up.len())
    }

    fn add_bias(&mut self, x: &mut [f32], bias: &TensorView<'_>) -> OpResult<()> {
        let (bb, row) = add_bias_args(x.len(), bias)?;
        if x.is_empty() {
            return Ok(());
        }
        let b = self.weight(bb, bias.ggml_type, bb.len() as u64, 1)?;
        self.binary("add_bias", x, None, Some(b[0].0.clone()), row)
    }

    fn scale(&mut self, x: &mut [f32], s: f32) -> OpResult<()> {
        if x.is_empty() {
            return Ok(());
        }
        let n = u32_of("scale", "length", x.len())?;
        let buf = self.upload(Slot::In0, x)?;
        let groups = self.grid_1d(n as u64)?;
        let mut enc = self.encoder();
        self.dispatch(&mut enc, "scale", &[n, s.to_bits()], &[(1, &buf)], groups)?;
        self.finish(enc, &buf, x)
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
        u32_of(OP, "length", x.len())?;
        let table = p.cos_sin_table(positions, n_rot);
        let x_buf = self.upload(Slot::In0, x)?;
        let t_buf = self.upload(Slot::RopeTable, &table)?;
        let total = positions.len() as u64 * n_head as u64 * (n_rot / 2) as u64;
        let groups = self.grid_1d(total)?;
        let params = [
            positions.len() as u32,
            n_head as u32,
            head_dim as u32,
            p.n_rot,
            u32::from(p.neox),
        ];
        let mut enc = self.encoder();
        self.dispatch(
            &mut enc,
            "rope",
            &params,
            &[(1, &x_buf), (2, &t_buf)],
            groups,
        )?;
        self.finish(enc, &x_buf, x)
    }

    fn kv_create(&mut self, spec: KvSpec) -> OpResult<u64> {
        const OP: &str = "kv_create";
        if !spec.head_dim_k.is_multiple_of(2) || !spec.head_dim_v.is_multiple_of(2) {
            return Err(format!(
                "{OP}: head sizes {}/{} must be even (two f16 per word)",
                spec.head_dim_k, spec.head_dim_v
            ));
        }
        let binding_limit = self.binding_limit;
        let device = self.gpu.device.clone();
        self.kv.create(spec, |elements| {
            let size = (elements as u64 * 2).max(16);
            if size > binding_limit {
                return Err(format!(
                    "{OP}: a layer's cache of {size} bytes exceeds the GPU's binding size {binding_limit}"
                ));
            }
            Ok(device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kv cache"),
                size,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            }))
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
        const OP: &str = "attention";
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
        let max_dim = self.gpu.limits.max_compute_workgroups_per_dimension;
        if p.n_head > max_dim || p.n_tokens > max_dim {
            return Err(format!(
                "{OP}: {n_head} heads × {n_tokens} tokens exceed the GPU's dispatch limits"
            ));
        }
        let scores_len = mul(OP, mul(OP, n_tokens, n_head)?, end)?;
        u32_of(OP, "score count", scores_len)?;
        let q_buf = self.upload(Slot::In0, q)?;
        let k_buf = self.upload(Slot::In1, k)?;
        let v_buf = self.upload(Slot::In2, v)?;
        let out_buf = self.scratch(Slot::Out, out.len() as u64 * 4)?;
        let scores = self.scratch(Slot::Scores, scores_len as u64 * 4)?;
        let (kc, vc) = {
            let cache = self.kv.get_mut(kv)?;
            (cache.k[layer].clone(), cache.v[layer].clone())
        };
        let mut enc = self.encoder();
        for (src, dst, d) in [(&k_buf, &kc, dk), (&v_buf, &vc, dv)] {
            let words = (n_tokens * n_head_kv * d / 2) as u32;
            if words == 0 {
                continue;
            }
            let off = (start * n_head_kv * d / 2) as u32;
            let groups = self.grid_1d(words as u64)?;
            self.dispatch(
                &mut enc,
                "store_f16",
                &[words, off],
                &[(1, src), (2, dst)],
                groups,
            )?;
        }
        let params = [
            p.n_head,
            p.n_head_kv,
            p.head_dim_k,
            p.head_dim_v,
            p.start_pos,
            p.sliding_window,
            p.scale.to_bits(),
            p.softcap.to_bits(),
            end as u32,
        ];
        self.dispatch(
            &mut enc,
            "attention",
            &params,
            &[(1, &q_buf), (2, &kc), (3, &vc), (4, &out_buf), (5, &scores)],
            [p.n_head, p.n_tokens, 1],
        )?;
        let r = self.finish(enc, &out_buf, out);
        if r.is_ok() {
            self.kv.get_mut(kv)?.hold(layer, end);
        }
        r
    }
}
