//! The backend operations on the GPU, host side: argument checks (the CPU backend's) and
//! the recorded dispatches.
//!
//! Device-buffer ABI (v5): activations live in storage buffers named by id ([`Buf`]
//! ranges, element offsets passed to each kernel). An operation only records its
//! dispatches into one pending command encoder; nothing is submitted and nothing waits
//! until `download`, which copies the range to a staging buffer, submits once, maps and
//! waits once. Per-operation arguments go to [`crate::params`], a range each. Weights are
//! uploaded once, in their stored blocks, and cached by mapping address; the KV cache
//! lives on the GPU.

mod fusion;
mod texel_pages;

use std::collections::HashMap;

use prima_abi::backend::{
    AttentionParams, AttentionSpan, Buf, KvSpec, RopeParams, TensorView, TransferCounts,
};
use wgpu::util::DeviceExt;

use crate::bind_groups::BindGroups;
use crate::device::Gpu;
use crate::formats::{Activation, Family, WeightShape};
use crate::kernels::{
    self, LegacyRows, ACT_UNIFORM_BYTES, ATT_MAX_HEAD_DIM, MATMUL_TOKENS_FLOAT,
    MATMUL_TOKENS_QUANT, MAX_UNROLLED_BLOCKS, TEXEL_FORMATS, WG,
};
use crate::params::ParamArena;
use crate::texels;
use fusion::{Deferred, MatmulGroup, QuantTarget};
use prima_gpu_support::backend::GpuOps;
use prima_gpu_support::bufs::{apart, offset_u32, Buffers};
use prima_gpu_support::checks::{
    add_bias_args, expect_len, mul, rms_norm_args, rope_args, OpResult,
};
use prima_gpu_support::kv::KvCaches;
use texel_pages::{TexelPages, TexelPart};

/// The scratch buffers an operation keeps to itself (recorded dispatches are ordered by
/// wgpu's barriers, so one buffer per role serves every operation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    /// A matmul's quantized activations.
    Act,
    /// The next matmul's, where a matmul's kernel quantizes them while reading its own
    /// from `Act` (fusion's `GateUp`, `MatmulNorm`); and the other way round.
    ActNext,
    /// Attention's scores.
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
    /// Q4_1 and Q8_0 matmul weights as texels for the legacy row kernels (CPU adapters),
    /// by the same key: whole rows per part, at most a texture's height, in `texel_pages`.
    weight_texels: HashMap<(usize, usize, u32), Vec<TexelPart>>,
    texel_pages: TexelPages,
    /// Activation buffers, by id.
    bufs: Buffers<wgpu::Buffer>,
    scratch: HashMap<Slot, wgpu::Buffer>,
    staging: Option<wgpu::Buffer>,
    kv: KvCaches<wgpu::Buffer>,
    /// The commands recorded since the last submit.
    pending: Option<wgpu::CommandEncoder>,
    params: ParamArena,
    /// Bind groups reused across tokens.
    bind_groups: BindGroups,
    counts: TransferCounts,
    /// Bytes one binding may hold: the device's limit.
    binding_limit: u64,
    /// Bytes one weight part may hold: the binding limit, lower in tests.
    part_limit: u64,
    /// The activations a scratch holds quantized (`quantized_slot`): (x's buffer id,
    /// offset, length, kind). Consecutive matmuls of the same x (q, k, v; gate, up)
    /// quantize it once; any dispatch but a matmul's, an upload or a dropped buffer forgets
    /// it (a matmul never writes its own x, and a new x replaces it).
    quantized: Option<(u64, u64, u64, Activation)>,
    /// The scratch that holds them (`Act` or `ActNext`).
    quantized_slot: Slot,
    /// The `_norm` kernels' count of finished workgroups (back to 0 by the last).
    counter: Option<wgpu::Buffer>,
    /// Matmul with one invocation per weight row (`rowmatmul_*`, for CPU adapters) rather
    /// than a workgroup per row (`matmul_*`, for GPUs). The same bits either way.
    pub row_per_invocation: bool,
    /// An operation held back for the next to take into its dispatch ([`fusion`]).
    deferred: Option<Deferred>,
    /// Per-kernel timings, where [`PROFILE`] asks for them.
    profile: Option<KernelTimes>,
}

/// The environment variable that times every kernel (`PRIMA_WGPU_PROFILE=1`): each
/// dispatch is then submitted and waited for on its own, so the totals are per-kernel
/// costs with the dispatch overhead included, not a normal run's. The table goes to
/// standard error when the backend is dropped.
pub const PROFILE: &str = "PRIMA_WGPU_PROFILE";

/// Calls and wall time per kernel and grid, the first call of each (which compiles the
/// pipeline) left out.
#[derive(Default)]
struct KernelTimes {
    by_kernel: HashMap<String, (u64, std::time::Duration)>,
}

impl KernelTimes {
    fn add(&mut self, kernel: &str, groups: [u32; 3], took: std::time::Duration) {
        let key = format!("{kernel} {groups:?}");
        match self.by_kernel.get_mut(&key) {
            Some((n, total)) => {
                *n += 1;
                *total += took;
            }
            None => {
                self.by_kernel.insert(key, (0, std::time::Duration::ZERO));
            }
        }
    }

    fn table(&self) -> String {
        let mut rows: Vec<_> = self.by_kernel.iter().filter(|(_, (n, _))| *n > 0).collect();
        rows.sort_by_key(|(_, (_, total))| std::cmp::Reverse(*total));
        let all: f64 = rows.iter().map(|(_, (_, t))| t.as_secs_f64()).sum();
        let mut s = format!("{PROFILE}: per kernel, each dispatch waited for alone\n");
        for (key, (n, total)) in rows {
            let t = total.as_secs_f64();
            s.push_str(&format!(
                "{:5.1}% {:9.1} ms {:7} × {:8.1} µs  {key}\n",
                100.0 * t / all.max(f64::MIN_POSITIVE),
                t * 1e3,
                n,
                t * 1e6 / *n as f64
            ));
        }
        s
    }
}

impl Drop for State {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            eprint!("{}", p.table());
        }
    }
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
            params: ParamArena::new(&gpu.limits),
            bind_groups: BindGroups::default(),
            gpu,
            weights: HashMap::new(),
            weight_bytes: 0,
            weight_texels: HashMap::new(),
            texel_pages: TexelPages::default(),
            bufs: Buffers::default(),
            scratch: HashMap::new(),
            staging: None,
            kv: KvCaches::default(),
            pending: None,
            counts: TransferCounts::default(),
            quantized: None,
            quantized_slot: Slot::Act,
            counter: None,
            binding_limit,
            part_limit,
            row_per_invocation: gpu_is_cpu,
            deferred: None,
            profile: std::env::var(PROFILE)
                .is_ok_and(|v| v == "1")
                .then(KernelTimes::default),
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

    /// The weight as whole texel rows (crate::texels) in the shared texture pages,
    /// uploaded on first use; `None` where its rows are wider than a texture may be.
    fn weight_texels(
        &mut self,
        bytes: &[u8],
        ty: u32,
        layout: texels::Layout,
        blocks: u32,
        rows: u32,
    ) -> Option<Vec<TexelPart>> {
        let key = (bytes.as_ptr() as usize, bytes.len(), ty);
        let max = self.gpu.limits.max_texture_dimension_2d;
        let width = layout.width(blocks as usize) * texels::INTERLEAVE;
        if width > max as usize || rows == 0 {
            return None;
        }
        // Weight rows per part (a multiple of INTERLEAVE).
        let max_rows = max.saturating_mul(texels::INTERLEAVE as u32);
        if !self.weight_texels.contains_key(&key) {
            let row_bytes = bytes.len() / rows as usize;
            let mut parts = Vec::new();
            let mut row0 = 0u32;
            while row0 < rows {
                let n = max_rows.min(rows - row0);
                let height = texels::Layout::texture_rows(n as usize) as u32;
                let from = row0 as usize * row_bytes;
                let data = layout.repack(
                    &bytes[from..from + n as usize * row_bytes],
                    blocks as usize,
                    n as usize,
                );
                let (view, tex0) =
                    self.texel_pages
                        .place(&self.gpu, ty, width as u32, height, max, &data);
                self.weight_bytes += data.len() as u64;
                parts.push(TexelPart {
                    view,
                    row0,
                    rows: n,
                    tex0,
                });
                row0 += n;
            }
            self.weight_texels.insert(key, parts);
        }
        Some(self.weight_texels[&key].clone())
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
                | wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        // A replaced scratch buffer is let go only once no bind group names it.
        if self.scratch.insert(slot, buf.clone()).is_some() {
            self.bind_groups.clear();
        }
        Ok(buf)
    }

    /// The activation buffer behind `b` (checked to hold the range) and `b`'s element
    /// offset as a kernel takes it.
    fn act(&self, op: &str, what: &str, b: Buf) -> OpResult<(wgpu::Buffer, u32)> {
        let buf = self.bufs.get(op, what, b)?.clone();
        Ok((buf, offset_u32(op, b)?))
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

    /// A quantize kernel's name and grid for `n_blocks` blocks: on CPU adapters its
    /// `narrow_` variant, a workgroup per [`kernels::QUANTIZE_NARROW_WG`] blocks.
    fn quantize_grid(&self, kernel: &str, n_blocks: u32) -> OpResult<(String, [u32; 3])> {
        if !self.row_per_invocation {
            return Ok((kernel.to_string(), self.grid_1d(n_blocks as u64)?));
        }
        let groups = n_blocks.div_ceil(kernels::QUANTIZE_NARROW_WG);
        let [x, y] = self.grid(groups as u64)?;
        Ok((format!("narrow_{kernel}"), [x, y, 1]))
    }

    fn grid_1d(&self, items: u64) -> OpResult<[u32; 3]> {
        let [x, y] = self.grid(items.div_ceil(WG as u64))?;
        Ok([x, y, 1])
    }

    /// The `_norm` kernels' counter, made (zeroed) on first use.
    fn counter(&mut self) -> wgpu::Buffer {
        let device = &self.gpu.device;
        self.counter
            .get_or_insert_with(|| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("finished workgroups"),
                    size: 16,
                    usage: wgpu::BufferUsages::STORAGE,
                    mapped_at_creation: false,
                })
            })
            .clone()
    }

    /// A matmul writing `out` leaves the quantized activations alone, but may write over
    /// their x (a float matmul's x is not quantized).
    fn forget_quantized_under(&mut self, out: Buf) {
        if let Some((id, offset, len, _)) = self.quantized {
            if id == out.id && out.offset < offset + len && offset < out.offset + out.len {
                self.quantized = None;
            }
        }
    }

    /// Records one dispatch of `kernel` into the pending encoder, with `params` (its
    /// uniform `P`, 4-byte fields) at binding 0 and `bufs` at their bindings.
    fn dispatch(
        &mut self,
        kernel: &str,
        params: &[u32],
        bufs: &[(u32, wgpu::BindingResource<'_>)],
        groups: [u32; 3],
    ) -> OpResult<()> {
        if !kernel.starts_with("matmul_")
            && !kernel.starts_with("rowmatmul_")
            && !kernel.starts_with("quantize_")
            && !kernel.starts_with("narrow_quantize_")
        {
            self.quantized = None;
        }
        let pipeline = self.gpu.pipeline(kernel)?;
        let uniform = self
            .params
            .push(&self.gpu.device, bytemuck::cast_slice(params));
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.binding(),
        }];
        for (binding, resource) in bufs {
            entries.push(wgpu::BindGroupEntry {
                binding: *binding,
                resource: resource.clone(),
            });
        }
        let bind_group = self
            .bind_groups
            .get(&self.gpu.device, kernel, &pipeline, &entries);
        let mut pass = self
            .encoder()
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(kernel),
                timestamp_writes: None,
            });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        drop(pass);
        if self.profile.is_some() {
            let start = std::time::Instant::now();
            self.submit();
            self.wait()?;
            if let Some(p) = &mut self.profile {
                p.add(kernel, groups, start.elapsed());
            }
        }
        Ok(())
    }

    /// The pending encoder, begun if there is none.
    fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        let device = &self.gpu.device;
        self.pending.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("prima ops"),
            })
        })
    }

    /// Submits the pending commands, their arguments written first.
    fn submit(&mut self) {
        self.params.flush(&self.gpu.queue);
        let commands = self.pending.take().map(|enc| enc.finish());
        self.gpu.queue.submit(commands);
        self.counts.submissions += 1;
    }

    /// Waits for everything submitted (and the mappings asked for); the parameter arena
    /// starts over.
    fn wait(&mut self) -> OpResult<()> {
        self.gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| format!("waiting for the GPU: {e}"))?;
        self.counts.waits += 1;
        if self.params.reset() {
            self.bind_groups.clear();
        }
        Ok(())
    }

    /// A staging buffer of at least `bytes` to read results back through.
    fn staging(&mut self, bytes: u64) -> wgpu::Buffer {
        match &self.staging {
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
        }
    }

    /// `kernel` (binary.wgsl) over `a`, with `b` repeating every `period` elements: `b` is
    /// an activation range or a weight (the bias, from its start).
    fn binary(
        &mut self,
        kernel: &'static str,
        a: Buf,
        b: wgpu::BindingResource<'_>,
        b_off: u32,
        period: usize,
    ) -> OpResult<()> {
        if a.is_empty() {
            return Ok(());
        }
        let n = u32_of(kernel, "length", a.len())?;
        let (a_buf, a_off) = self.act(kernel, "x", a)?;
        let groups = self.grid_1d(n as u64)?;
        self.dispatch(
            kernel,
            &[n, period as u32, a_off, b_off],
            &[(1, a_buf.as_entire_binding()), (2, b)],
            groups,
        )
    }

    /// The checks of [`State::binary_act`], for an operation held back.
    fn check_binary(&self, kernel: &'static str, a: Buf, b: Buf) -> OpResult<()> {
        expect_len(kernel, "second operand length", b.len(), a.len())?;
        apart(kernel, a, &[b])?;
        self.act(kernel, "second operand", b)?;
        self.act(kernel, "x", a)?;
        u32_of(kernel, "length", a.len())?;
        self.grid_1d(a.len() as u64)?;
        Ok(())
    }

    /// An element-wise operation of two activation ranges of one length.
    fn binary_act(&mut self, kernel: &'static str, a: Buf, b: Buf) -> OpResult<()> {
        expect_len(kernel, "second operand length", b.len(), a.len())?;
        apart(kernel, a, &[b])?;
        let (b_buf, b_off) = self.act(kernel, "second operand", b)?;
        self.binary(kernel, a, b_buf.as_entire_binding(), b_off, b.len())
    }
}

impl GpuOps for State {
    const NAME: &'static str = "wgpu";

    /// wgpu reports invalid use and exhausted memory through error scopes, not return
    /// values: both are collected around each operation. An operation held back
    /// ([`fusion`]) is dispatched first unless this one may take it in.
    fn guarded<T>(&mut self, op: &str, f: impl FnOnce(&mut Self) -> OpResult<T>) -> OpResult<T> {
        let oom = self
            .gpu
            .device
            .push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let invalid = self
            .gpu
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let may_fuse = matches!(
            op,
            "add" | "rms_norm" | "matmul" | "swiglu" | "rope" | "attention"
        );
        let r = match may_fuse {
            true => Ok(()),
            false => self.flush_deferred(),
        }
        .and_then(|()| f(self));
        let invalid = pollster::block_on(invalid.pop());
        let oom = pollster::block_on(oom.pop());
        match (r, invalid.or(oom)) {
            (Ok(_), Some(e)) => Err(format!("{op}: GPU error: {e}")),
            (r, _) => r,
        }
    }

    fn buf_create(&mut self, len: usize) -> OpResult<u64> {
        let bytes = mul("buf_create", len, 4)? as u64;
        if bytes > self.binding_limit {
            return Err(format!(
                "buf_create: {bytes} bytes of activations exceed the GPU's binding size {}",
                self.binding_limit
            ));
        }
        // wgpu zeroes new buffers.
        let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("activations"),
            size: bytes.max(4).div_ceil(4) * 4,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok(self.bufs.insert(buf, len as u64))
    }

    fn buf_drop(&mut self, id: u64) {
        self.quantized = None;
        // Recorded commands keep their own reference until they have run.
        self.bufs.remove(id);
        self.bind_groups.clear();
    }

    /// Written with `queue.write_buffer` where nothing is recorded yet (it runs before the
    /// next submission's commands: the right order then); else copied in the encoder from
    /// a buffer of its own, after the commands recorded so far.
    fn upload(&mut self, dst: Buf, src: &[f32]) -> OpResult<()> {
        self.quantized = None;
        const OP: &str = "upload";
        expect_len(OP, "source length", src.len(), dst.len())?;
        let buf = self.bufs.get(OP, "destination", dst)?.clone();
        self.counts.uploads += 1;
        if src.is_empty() {
            return Ok(());
        }
        let bytes: &[u8] = bytemuck::cast_slice(src);
        self.counts.bytes_up += bytes.len() as u64;
        let at = dst.offset * 4;
        if self.pending.is_none() {
            self.gpu.queue.write_buffer(&buf, at, bytes);
        } else {
            let from = self
                .gpu
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("upload"),
                    contents: bytes,
                    usage: wgpu::BufferUsages::COPY_SRC,
                });
            self.encoder()
                .copy_buffer_to_buffer(&from, 0, &buf, at, bytes.len() as u64);
        }
        Ok(())
    }

    fn download(&mut self, src: Buf, dst: &mut [f32]) -> OpResult<()> {
        const OP: &str = "download";
        expect_len(OP, "destination length", dst.len(), src.len())?;
        let buf = self.bufs.get(OP, "source", src)?.clone();
        let bytes = (dst.len() * 4) as u64;
        let staging = self.staging(bytes);
        if bytes > 0 {
            self.encoder()
                .copy_buffer_to_buffer(&buf, src.offset * 4, &staging, 0, bytes);
        }
        self.submit();
        self.counts.downloads += 1;
        self.counts.bytes_down += bytes;
        if bytes == 0 {
            return self.wait();
        }
        let slice = staging.slice(0..bytes);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| "the GPU read-back was dropped".to_string())?
            .map_err(|e| format!("reading the result back: {e}"))?;
        {
            let data = slice
                .get_mapped_range()
                .map_err(|e| format!("mapping the read-back buffer: {e}"))?;
            dst.copy_from_slice(bytemuck::cast_slice(&data));
        }
        staging.unmap();
        Ok(())
    }

    fn transfers(&self) -> TransferCounts {
        TransferCounts {
            param_bytes: self.params.total_bytes,
            ..self.counts
        }
    }

    fn get_rows(&mut self, table: &TensorView<'_>, ids: &[u32], out: Buf) -> OpResult<()> {
        const OP: &str = "get_rows";
        let shape = WeightShape::for_get_rows("wgpu", table, ids, out.len())?;
        if ids.is_empty() || shape.cols == 0 {
            return Ok(());
        }
        let n = u32_of(OP, "output size", out.len())?;
        let (out_buf, out_off) = self.act(OP, "out", out)?;
        let kernel = format!("get_rows_{}", shape.format.kernel);
        let parts = self.weight(
            table.data.as_slice(),
            table.ggml_type,
            shape.row_bytes,
            shape.rows,
        )?;
        let ids_at = self
            .params
            .push(&self.gpu.device, bytemuck::cast_slice(ids));
        let groups = self.grid_1d(n as u64)?;
        for (buf, row0, rows) in &parts {
            let params = [
                shape.cols,
                shape.row_bytes as u32,
                ids.len() as u32,
                *row0,
                *rows,
                out_off,
            ];
            self.dispatch(
                &kernel,
                &params,
                &[
                    (1, buf.as_entire_binding()),
                    (2, ids_at.binding()),
                    (3, out_buf.as_entire_binding()),
                ],
                groups,
            )?;
        }
        Ok(())
    }

    fn matmul(&mut self, w: &TensorView<'_>, x: Buf, n_tokens: usize, out: Buf) -> OpResult<()> {
        const OP: &str = "matmul";
        let shape = WeightShape::for_matmul("wgpu", w, x.len(), n_tokens, out.len())?;
        if n_tokens == 0 || shape.rows == 0 {
            return Ok(());
        }
        apart(OP, out, &[x])?;
        u32_of(OP, "output size", out.len())?;
        let n = u32_of(OP, "n_tokens", n_tokens)?;
        let (x_buf, x_off) = self.act(OP, "x", x)?;
        let (out_buf, out_off) = self.act(OP, "out", out)?;
        let act = shape.format.activation;
        let key = Some((x.id, x.offset, x.len, act));
        // A held matmul of the same quantized activations may take this one in (below);
        // else the held operation that writes x quantizes it too, and any other runs first.
        let may_join = matches!(&self.deferred, Some(Deferred::Matmul(g)) if g.act_key == key)
            && self.quantized == key;
        let producer = match may_join {
            true => None,
            false => self.take_producer_of(x, act),
        };
        if producer.is_none() && !may_join {
            self.flush_deferred()?;
        }
        // CPU adapters: the legacy formats' whole-block kernel, one token per workgroup
        // for a generated token, a batch's worth otherwise.
        let legacy_rows = self.row_per_invocation && shape.format.family == Family::Legacy;
        let legacy_tokens = if n == 1 { 1 } else { MATMUL_TOKENS_QUANT };
        // Weight parts: a binding each (a buffer at 1 or a texture at 4), first row, rows.
        let layout = texels::Layout::of(shape.format.ty)
            .filter(|_| legacy_rows && TEXEL_FORMATS.contains(&shape.format.kernel));
        let tex_parts = layout.and_then(|l| {
            self.weight_texels(
                w.data.as_slice(),
                w.ggml_type,
                l,
                shape.cols / 32,
                shape.rows,
            )
        });
        let use_texels = tex_parts.is_some();
        let buf_parts = match tex_parts {
            Some(_) => Vec::new(),
            None => self.weight(w.data.as_slice(), w.ggml_type, shape.row_bytes, shape.rows)?,
        };
        // (binding, weight, first row, rows, first texture row).
        let parts: Vec<(u32, wgpu::BindingResource<'_>, u32, u32, u32)> = match &tex_parts {
            Some(t) => t
                .iter()
                .map(|p| {
                    let view = wgpu::BindingResource::TextureView(&p.view);
                    (4, view, p.row0, p.rows, p.tex0)
                })
                .collect(),
            None => buf_parts
                .iter()
                .map(|(b, r0, n)| (1, b.as_entire_binding(), *r0, *n, 0))
                .collect(),
        };
        let mut act_uniform = false;
        let (input, extra, per_group) = match act {
            Activation::Float => (x_buf, [x_off, 0u32], MATMUL_TOKENS_FLOAT),
            _ => {
                // Quants (4 per word), then a scale per block, then Q8_1's sums (one per
                // block) and pair words (16 per block, quantize_blocks.wgsl) or Q8_K's sums
                // (one per 16 elements).
                let elems = u32_of(OP, "activation size", x.len())?;
                let n_blocks = elems / act.block_elems() as u32;
                let d_off = elems / 4;
                let (s_off, s_len, pair_words) = match act {
                    Activation::Q8_1 => (d_off + n_blocks, n_blocks, 16 * n_blocks),
                    Activation::Q8K => (d_off + n_blocks, elems / 16, 0),
                    _ => (d_off, 0, 0),
                };
                let words = (s_off + s_len).max(d_off + n_blocks) as u64;
                // The legacy row kernels read activations that fit a uniform binding from
                // one (see matmul_legacy_rows.wgsl), which binds ACT_UNIFORM_BYTES; only a
                // generated token's kernel reads the pair words, which then fit too.
                act_uniform = legacy_rows
                    && words * 4 <= ACT_UNIFORM_BYTES
                    && self.gpu.limits.max_uniform_buffer_binding_size >= ACT_UNIFORM_BYTES;
                let whole = (words + pair_words as u64) * 4;
                let act_bytes = if act_uniform {
                    ACT_UNIFORM_BYTES.max(whole)
                } else {
                    whole
                };
                // A matmul that quantizes this one's input writes it beside its own.
                let slot = match producer.as_ref().and_then(|p| p.matmul_input()) {
                    Some(input) if self.scratch.get(&Slot::Act) == Some(input) => Slot::ActNext,
                    Some(_) => Slot::Act,
                    None if self.quantized == key => self.quantized_slot,
                    None => Slot::Act,
                };
                let act_buf = self.scratch(slot, act_bytes)?;
                let quantize = act
                    .quantize_kernel()
                    .ok_or("float activations are not quantized")?;
                if let Some(p) = producer {
                    let to = QuantTarget {
                        act,
                        buf: act_buf.clone(),
                        d_off,
                        s_off,
                    };
                    self.quantize_from(p, to)?;
                    self.quantized = key;
                    self.quantized_slot = slot;
                } else if self.quantized != key {
                    let (quantize, groups) = self.quantize_grid(quantize, n_blocks)?;
                    self.dispatch(
                        &quantize,
                        &[n_blocks, d_off, s_off, x_off, 0],
                        &[
                            (1, x_buf.as_entire_binding()),
                            (2, act_buf.as_entire_binding()),
                        ],
                        groups,
                    )?;
                    self.quantized = key;
                    self.quantized_slot = slot;
                }
                let per_group = if legacy_rows {
                    legacy_tokens
                } else {
                    MATMUL_TOKENS_QUANT
                };
                (act_buf, [d_off, s_off], per_group)
            }
        };
        let rows_variant = LegacyRows {
            tokens: legacy_tokens,
            uniform: act_uniform,
            texels: use_texels,
            // A generated token's kernel has its block loop unrolled (see LegacyRows).
            unrolled: if n == 1
                && shape.cols / 32 <= MAX_UNROLLED_BLOCKS
                && kernels::unrolled_offsets(act, shape.cols / 32) == (extra[0], extra[1])
            {
                shape.cols / 32
            } else {
                0
            },
            segments: 1,
            swiglu: None,
            rope: false,
            norm: None,
        };
        // A generated token's texel matmul is held, so that the next of the same
        // activations whose weight follows it in its texture joins its dispatch.
        if legacy_rows && use_texels && rows_variant.unrolled > 0 && act_uniform {
            if let Some([part]) = tex_parts.as_deref() {
                let call = MatmulGroup {
                    variant: rows_variant,
                    format: shape.format.kernel,
                    page: part.view.clone(),
                    tex0: part.tex0,
                    rows: part.rows,
                    shape: [shape.cols, shape.row_bytes as u32, extra[0], extra[1]],
                    input: input.clone(),
                    act_key: key,
                    outputs: vec![(0, out_buf.clone(), out_off)],
                };
                self.hold_matmul(call)?;
                self.forget_quantized_under(out);
                return Ok(());
            }
        }
        if may_join {
            self.flush_deferred()?;
        }
        let kernel = if legacy_rows {
            rows_variant.name(shape.format.kernel)
        } else if self.row_per_invocation {
            format!("rowmatmul_{}", shape.format.kernel)
        } else {
            format!("matmul_{}", shape.format.kernel)
        };
        let input_binding = if act_uniform {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &input,
                offset: 0,
                size: std::num::NonZeroU64::new(ACT_UNIFORM_BYTES),
            })
        } else {
            input.as_entire_binding()
        };
        let z = n.div_ceil(per_group);
        if z > self.gpu.limits.max_compute_workgroups_per_dimension {
            return Err(format!(
                "{OP}: {n_tokens} tokens exceed the GPU's dispatch limits"
            ));
        }
        for (slot, weight, row0, rows, tex0) in &parts {
            let groups = if self.row_per_invocation {
                rows.div_ceil(WG)
            } else {
                *rows
            };
            let [gx, gy] = self.grid(groups as u64)?;
            let head = [
                shape.cols,
                *rows,
                shape.row_bytes as u32,
                n,
                *row0,
                shape.rows,
            ];
            let mut params = head.to_vec();
            match act {
                // a_off, out_off.
                Activation::Float => params.extend([extra[0], out_off]),
                // d_off, s_off, out_off, `zero` of the row-per-invocation kernels, and the
                // legacy row kernels' first texture row (one weight: no later ones).
                _ => params.extend([
                    extra[0], extra[1], out_off, 0, *tex0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                ]),
            }
            self.dispatch(
                &kernel,
                &params,
                &[
                    (*slot, weight.clone()),
                    (2, input_binding.clone()),
                    (3, out_buf.as_entire_binding()),
                ],
                [gx, gy, z],
            )?;
        }
        self.forget_quantized_under(out);
        Ok(())
    }

    fn rms_norm(&mut self, x: Buf, weight: &TensorView<'_>, eps: f32, out: Buf) -> OpResult<()> {
        const OP: &str = "rms_norm";
        let (wb, n) = rms_norm_args(x.len(), weight, out.len())?;
        if x.is_empty() {
            return Ok(());
        }
        apart(OP, out, &[x])?;
        u32_of(OP, "length", x.len())?;
        self.act(OP, "x", x)?;
        self.act(OP, "out", out)?;
        let rows = x.len() / n;
        u32_of(OP, "rows", rows)?;
        let w = self.weight(wb, weight.ggml_type, wb.len() as u64, 1)?;
        self.grid(rows as u64)?;
        self.defer_rms_norm(x, w[0].0.clone(), n as u32, eps, out)
    }

    fn add(&mut self, acc: Buf, x: Buf) -> OpResult<()> {
        self.check_binary("add", acc, x)?;
        self.defer_add(acc, x)
    }

    fn swiglu(&mut self, gate: Buf, up: Buf) -> OpResult<()> {
        self.check_binary("swiglu", gate, up)?;
        self.defer_swiglu(gate, up)
    }

    fn geglu(&mut self, gate: Buf, up: Buf) -> OpResult<()> {
        self.binary_act("geglu", gate, up)
    }

    fn add_bias(&mut self, x: Buf, bias: &TensorView<'_>) -> OpResult<()> {
        let (bb, row) = add_bias_args(x.len(), bias)?;
        if x.is_empty() {
            return Ok(());
        }
        let b = self.weight(bb, bias.ggml_type, bb.len() as u64, 1)?;
        self.binary("add_bias", x, b[0].0.as_entire_binding(), 0, row)
    }

    fn scale(&mut self, x: Buf, s: f32) -> OpResult<()> {
        if x.is_empty() {
            return Ok(());
        }
        let n = u32_of("scale", "length", x.len())?;
        let (buf, x_off) = self.act("scale", "x", x)?;
        let groups = self.grid_1d(n as u64)?;
        self.dispatch(
            "scale",
            &[n, s.to_bits(), x_off],
            &[(1, buf.as_entire_binding())],
            groups,
        )
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
        u32_of(OP, "length", x.len())?;
        let (_, x_off) = self.act(OP, "x", x)?;
        let total = positions.len() as u64 * n_head as u64 * (n_rot / 2) as u64;
        self.grid_1d(2 * total)?;
        let rope = fusion::Rope {
            x,
            x_off,
            n_head: n_head as u32,
            head_dim: head_dim as u32,
            n_rot: p.n_rot,
            neox: p.neox,
            n_tokens: positions.len() as u32,
            table: p.cos_sin_table(positions, n_rot),
        };
        self.rope_or_pair(rope)
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
        self.bind_groups.clear();
    }

    fn kv_truncate(&mut self, kv: u64, n_pos: u32) -> OpResult<()> {
        self.kv.truncate(kv, n_pos)
    }

    /// One span after another: its keys and values stored into its cache (`store_f16`, one
    /// dispatch for both, or the held RoPE's: `rope_pair_store`),
    /// then a dispatch of (head, token) workgroups over its rows of `q` and `out`.
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
        // The held RoPE of q and k stores k and v too, for a single span of whole words.
        let single = plans.len() == 1;
        // A held q, k, v projection with their RoPE does it all, a head a workgroup.
        let mut qkv_rope = match &plans[..] {
            [plan] if plan.row0 == 0 && plan.n_tokens == 1 => {
                let (k_buf, k_off) = self.act(OP, "k", k)?;
                let (v_buf, v_off) = self.act(OP, "v", v)?;
                self.take_qkv_rope_of((&k_buf, k_off), (&v_buf, v_off), p)
            }
            _ => None,
        };
        let mut rope_pair = match &plans[..] {
            _ if qkv_rope.is_some() => None,
            [plan] if plan.row0 == 0 && p.head_dim_v.is_multiple_of(2) => self.take_rope_pair_of(
                k,
                p.n_head_kv,
                p.head_dim_k,
                u32_of(OP, "n_tokens", plan.n_tokens)?,
            ),
            _ => None,
        };
        if rope_pair.is_none() && qkv_rope.is_none() {
            self.flush_deferred()?;
        }
        let (n_head, n_head_kv) = (p.n_head as usize, p.n_head_kv as usize);
        let (dk, dv) = (p.head_dim_k as usize, p.head_dim_v as usize);
        let layer = p.layer as usize;
        let (q_buf, q_off) = self.act(OP, "q", q)?;
        let (k_buf, k_off) = self.act(OP, "k", k)?;
        let (v_buf, v_off) = self.act(OP, "v", v)?;
        let (out_buf, out_off) = self.act(OP, "out", out)?;
        let max_dim = self.gpu.limits.max_compute_workgroups_per_dimension;
        for plan in plans {
            let (n_tokens, start, end) = (plan.n_tokens, plan.positions.start, plan.positions.end);
            if p.n_head > max_dim || n_tokens > max_dim as usize {
                return Err(format!(
                    "{OP}: {n_head} heads × {n_tokens} tokens exceed the GPU's dispatch limits"
                ));
            }
            let scores_len = mul(OP, mul(OP, n_tokens, n_head)?, end)?;
            u32_of(OP, "score count", scores_len)?;
            let scores = self.scratch(Slot::Scores, scores_len as u64 * 4)?;
            let (kc, vc) = {
                let cache = self.kv.get_mut(plan.kv)?;
                (cache.k[layer].clone(), cache.v[layer].clone())
            };
            let row0 = plan.row0;
            // The keys' and values' words, cache offsets and source offsets.
            let mut store = [0u32; 6];
            for (i, (src_off, d)) in [(k_off, dk), (v_off, dv)].into_iter().enumerate() {
                store[3 * i] = u32_of(OP, "cache words", n_tokens * n_head_kv * d / 2)?;
                store[3 * i + 1] = u32_of(OP, "cache offset", start * n_head_kv * d / 2)?;
                store[3 * i + 2] = src_off + u32_of(OP, "row offset", row0 * n_head_kv * d)?;
            }
            let words = store[0] as u64 + store[3] as u64;
            let to = || fusion::KvStore {
                kc: kc.clone(),
                k_at: store[1],
                v_words: store[3],
                v: (v_buf.clone(), store[5]),
                vc: vc.clone(),
                v_at: store[4],
            };
            if let Some((group, q_rope)) = qkv_rope.take() {
                self.dispatch_qkv_rope(group, q_rope, to())?;
            } else if let Some((q_rope, k_rope)) = rope_pair.take() {
                self.dispatch_rope(q_rope, Some(k_rope), Some(to()))?;
            } else if words > 0 {
                let groups = self.grid_1d(words)?;
                self.dispatch(
                    "store_f16",
                    &store,
                    &[
                        (1, k_buf.as_entire_binding()),
                        (2, kc.as_entire_binding()),
                        (3, v_buf.as_entire_binding()),
                        (4, vc.as_entire_binding()),
                    ],
                    groups,
                )?;
            }
            let params = [
                p.n_head,
                p.n_head_kv,
                p.head_dim_k,
                p.head_dim_v,
                start as u32,
                p.sliding_window,
                p.scale.to_bits(),
                p.softcap.to_bits(),
                end as u32,
                q_off + u32_of(OP, "row offset", row0 * n_head * dk)?,
                out_off + u32_of(OP, "row offset", row0 * n_head * dv)?,
            ];
            let kernel = match self.row_per_invocation {
                true if p.head_dim_k == 64 => "attention_narrow_d64",
                true => "attention_narrow",
                false => "attention",
            };
            let call = fusion::AttentionCall {
                kernel,
                params,
                buffers: [q_buf.clone(), kc, vc, out_buf.clone(), scores],
                groups: [p.n_head, n_tokens as u32, 1],
                out,
                dv: p.head_dim_v,
            };
            self.kv.get_mut(plan.kv)?.hold(layer, end);
            // On CPU adapters a single span's attention is held: the matmul of its output
            // may have it quantize that too (fusion).
            if self.row_per_invocation && single {
                self.defer(Deferred::Attention(call))?;
            } else {
                self.dispatch_attention(call, None)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::KernelTimes;
    use std::time::Duration;

    #[test]
    fn kernel_times_leave_out_each_first_call_and_sort_by_total() {
        let mut t = KernelTimes::default();
        let ms = Duration::from_millis;
        t.add("a", [1, 1, 1], ms(500)); // compiles: left out
        t.add("a", [1, 1, 1], ms(2));
        t.add("a", [1, 1, 1], ms(4));
        t.add("b", [9, 1, 1], ms(500));
        t.add("b", [9, 1, 1], ms(10));
        t.add("c", [1, 1, 1], ms(7)); // one call only: no row
        let table = t.table();
        let rows: Vec<&str> = table.lines().skip(1).collect();
        assert_eq!(rows.len(), 2, "{table}");
        assert!(rows[0].ends_with("b [9, 1, 1]"), "{table}");
        assert!(
            rows[1].contains("2 ×") && rows[1].contains("3000.0 µs"),
            "{table}"
        );
    }
}
