//! Backend plugin ABI, version 5: the only way the engine reaches compute.
//!
//! A backend is a small table of operations — matrix products against quantized weights,
//! norms, RoPE, attention over a backend-owned KV cache — in the spirit of ggml's backend
//! interface. The model code composes these operations and never knows which hardware
//! runs them. Weights are passed as [`TensorView`]s: byte slices of the memory-mapped GGUF
//! file, never copies. Activations live in buffers the backend owns ([`Buf`]): a GPU
//! backend queues operations on them and the host waits only when it downloads a window's
//! output ([`TransferCounts`] counts every crossing). Version 4 passed host slices to
//! every operation, so a GPU paid a copy and a wait per operation.
//!
//! Every type crossing the boundary derives `StableAbi`, so `abi_stable` checks the layout
//! when a plugin is loaded; [`BACKEND_ABI_VERSION`] is checked before that and must be
//! bumped whenever anything in this file changes meaning.

// abi_stable's `sabi_trait` expands to impls inside a const block.
#![allow(non_local_definitions)]
// An operation takes its buffers one by one (attention with sinks: eight), in the trait
// and in what `sabi_trait` expands it to.
#![allow(clippy::too_many_arguments)]

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    package_version_strings, sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, ROption, RResult, RSlice, RSliceMut, RString},
    StableAbi,
};

/// Version of the backend ABI defined in this file. A plugin built for another version is
/// refused at load time.
pub const BACKEND_ABI_VERSION: u32 = 5;

/// A weight tensor as it lies in the GGUF mapping.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// The tensor's bytes, exactly `rows * row_bytes(cols)` long.
    pub data: RSlice<'a, u8>,
    /// GGUF type id (see [`crate::GgmlType`]).
    pub ggml_type: u32,
    /// Elements per row (GGUF `ne[0]`).
    pub cols: u64,
    /// Number of rows (the product of the other dimensions).
    pub rows: u64,
}

/// How a backend instance is created.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct BackendConfig {
    /// Worker threads for compute; 0 lets the backend choose.
    pub threads: u32,
}

/// Rotary position embedding parameters, from the model's GGUF metadata.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct RopeParams<'a> {
    /// Leading dimensions of each head that are rotated.
    pub n_rot: u32,
    pub freq_base: f32,
    /// 1 / linear scaling factor.
    pub freq_scale: f32,
    /// NeoX ordering rotates pairs (i, i + n_rot/2); the normal ordering rotates (2i, 2i+1).
    pub neox: bool,
    /// Per-dimension frequency divisors (the `rope_freqs` tensor of Llama 3.1+), n_rot/2 long.
    pub freq_factors: ROption<RSlice<'a, f32>>,
    /// YaRN extrapolation mix; 0 disables YaRN.
    pub ext_factor: f32,
    /// Magnitude scaling applied to the rotated values.
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Context length the model was trained with (for YaRN).
    pub n_ctx_orig: u32,
}

impl RopeParams<'_> {
    /// `[low, high]` dims between which YaRN ramps from extrapolation to interpolation.
    pub fn yarn_corr_dims(&self, n_dims: usize) -> [f32; 2] {
        use std::f32::consts::PI;
        let corr_dim = |n_rot: f32| {
            n_dims as f32 * (self.n_ctx_orig as f32 / (n_rot * 2.0 * PI)).ln()
                / (2.0 * self.freq_base.ln())
        };
        let start = corr_dim(self.beta_fast).floor();
        let end = corr_dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n_dims as f32 - 1.0)]
    }

    /// `[cos, sin]` of every pair (`n_rot / 2` of them) of every position, token-major
    /// (`table[(t · n_rot/2 + i) · 2 ..]`), by [`Self::fill_cos_sin`]: the table a GPU
    /// backend uploads so that only the rotation runs on the GPU and it turns by the CPU's
    /// bits. Small: n_tokens × n_rot floats.
    pub fn cos_sin_table(&self, positions: &[u32], n_rot: usize) -> Vec<f32> {
        let half = n_rot / 2;
        let corr = self.yarn_corr_dims(n_rot);
        let mut out = vec![0f32; positions.len() * 2 * half];
        for (&pos, cs_pos) in positions.iter().zip(out.chunks_exact_mut(2 * half)) {
            self.fill_cos_sin(cs_pos, pos, n_rot, corr);
        }
        out
    }

    /// Fills `cos_sin` with the `[cos, sin]` of each pair (`n_rot / 2`) at position `pos`:
    /// θ_i = pos · base^(−2i/n_rot), the power accumulated by repeated f32 multiplication
    /// as ggml does, over `freq_factors[i]`; YaRN mixes by the ramp over `corr`
    /// ([`Self::yarn_corr_dims`]). Every backend computes its angles here, in the host's
    /// f32, so they rotate by the same bits (a GPU's cos/sin are an ulp off now and then).
    pub fn fill_cos_sin(&self, cos_sin: &mut [f32], pos: u32, n_rot: usize, corr: [f32; 2]) {
        let ramp = |pair: usize| {
            let y = (pair as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            1.0 - y.clamp(0.0, 1.0)
        };
        let theta_scale = self.freq_base.powf(-2.0 / n_rot as f32);
        let factors = self
            .freq_factors
            .as_ref()
            .map(|f| f.as_slice())
            .into_option();
        let mut theta = pos as f32;
        for (i, cs) in cos_sin.chunks_exact_mut(2).enumerate() {
            let ff = factors.map_or(1.0, |f| f[i]);
            let theta_extrap = theta / ff;
            let theta_interp = self.freq_scale * theta_extrap;
            let (mut angle, mut mscale) = (theta_interp, self.attn_factor);
            if self.ext_factor != 0.0 {
                let mix = ramp(i) * self.ext_factor;
                angle = theta_interp * (1.0 - mix) + theta_extrap * mix;
                mscale *= 1.0 + 0.1 * (1.0 / self.freq_scale).ln();
            }
            cs[0] = angle.cos() * mscale;
            cs[1] = angle.sin() * mscale;
            theta *= theta_scale;
        }
    }
}

/// Shape of a KV cache the backend allocates and owns.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct KvSpec {
    pub n_layers: u32,
    /// Positions the cache can hold.
    pub n_ctx: u32,
    pub n_head_kv: u32,
    pub head_dim_k: u32,
    pub head_dim_v: u32,
}

/// One attention call: store the new keys and values of `n_tokens` positions starting at
/// `start_pos` into layer `layer` of the cache, then attend causally.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug)]
pub struct AttentionParams {
    pub layer: u32,
    pub n_tokens: u32,
    pub start_pos: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub head_dim_k: u32,
    pub head_dim_v: u32,
    /// Multiplier of q·k before the softmax (usually 1/sqrt(head_dim_k)).
    pub scale: f32,
    /// Attend only to the last `sliding_window` positions; 0 means unlimited.
    pub sliding_window: u32,
    /// Logit soft-capping value; 0 disables it.
    pub softcap: f32,
}

impl AttentionParams {
    /// Checks one attention call against the contract every backend keeps: the layer and
    /// head shapes against the cache's `spec`, head sizes up to the backend's
    /// `max_head_dim`, the lengths of `q`, `k`, `v` and `out`, and the positions against
    /// the cache's context. The error names what is wrong.
    pub fn check(
        &self,
        spec: &KvSpec,
        max_head_dim: usize,
        lens: [usize; 4],
    ) -> Result<(), String> {
        const OP: &str = "attention";
        let (n_tokens, n_head, n_head_kv) = (
            self.n_tokens as usize,
            self.n_head as usize,
            self.n_head_kv as usize,
        );
        let (dk, dv) = (self.head_dim_k as usize, self.head_dim_v as usize);
        if self.layer >= spec.n_layers {
            return Err(format!(
                "{OP}: layer {} is out of range for a cache of {} layers",
                self.layer, spec.n_layers
            ));
        }
        if self.n_head_kv != spec.n_head_kv
            || self.head_dim_k != spec.head_dim_k
            || self.head_dim_v != spec.head_dim_v
        {
            return Err(format!(
                "{OP}: n_head_kv/head_dim_k/head_dim_v {}/{}/{} differ from the cache's {}/{}/{}",
                self.n_head_kv,
                self.head_dim_k,
                self.head_dim_v,
                spec.n_head_kv,
                spec.head_dim_k,
                spec.head_dim_v
            ));
        }
        if dk > max_head_dim || dv > max_head_dim {
            return Err(format!(
                "{OP}: head sizes {dk}/{dv} exceed the supported {max_head_dim}"
            ));
        }
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(format!(
                "{OP}: n_head {n_head} is not a positive multiple of n_head_kv {n_head_kv}"
            ));
        }
        self.check_lengths(n_tokens, lens)?;
        let start = self.start_pos as usize;
        let end = start.saturating_add(n_tokens);
        if end > spec.n_ctx as usize {
            return Err(format!(
                "{OP}: positions {start}..{end} exceed the cache's n_ctx {}",
                spec.n_ctx
            ));
        }
        Ok(())
    }

    /// Checks the lengths of `q`, `k`, `v` and `out` against `n_tokens` rows of this
    /// call's heads (part of [`AttentionParams::check`]).
    fn check_lengths(&self, n_tokens: usize, lens: [usize; 4]) -> Result<(), String> {
        let (n_head, n_head_kv) = (self.n_head as usize, self.n_head_kv as usize);
        let (dk, dv) = (self.head_dim_k as usize, self.head_dim_v as usize);
        let [q, k, v, out] = lens;
        for (what, got, heads, dim) in [
            ("q length", q, n_head, dk),
            ("k length", k, n_head_kv, dk),
            ("v length", v, n_head_kv, dv),
            ("out length", out, n_head, dv),
        ] {
            let want = heads
                .checked_mul(dim)
                .and_then(|x| x.checked_mul(n_tokens))
                .ok_or_else(|| format!("attention: size {n_tokens} × {heads} × {dim} overflows"))?;
            if got != want {
                return Err(format!("attention: {what} is {got}, expected {want}"));
            }
        }
        Ok(())
    }

    /// Checks the lengths of `q`, `k`, `v` and `out` of a batched call
    /// ([`Backend::attention_spans`]) against all the spans' rows, and returns how many
    /// rows that is; each span is then checked against its cache by [`AttentionParams::check`].
    pub fn check_span_lengths(
        &self,
        spans: &[AttentionSpan],
        lens: [usize; 4],
    ) -> Result<usize, String> {
        let rows = spans.iter().map(|s| s.n_tokens as usize).sum();
        self.check_lengths(rows, lens)?;
        Ok(rows)
    }
}

/// One request's rows in a batched attention call ([`Backend::attention_spans`]): its
/// `n_tokens` rows, next after the previous span's, go to KV cache `kv` at positions from
/// `start_pos`.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSpan {
    pub kv: u64,
    pub n_tokens: u32,
    pub start_pos: u32,
}

/// A GPU's memory as its backend plugin sees it (see [`BackendPlugin::gpu_memory`]): what
/// profiles give Halda as the VRAM bound of the device's GPU layers.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuMemory {
    pub total_bytes: u64,
    /// Free now (CUDA's `cuMemGetInfo`; on unified memory, what the GPU may still take).
    pub free_bytes: u64,
    /// CPU and GPU share RAM (Apple GPUs): no copy crosses a bus, and the figures are RAM's.
    pub unified: bool,
}

/// Result type of every fallible backend operation; the error names what was wrong.
pub type BackendResult<T> = RResult<T, RString>;

/// A range of an activation buffer the backend owns: `len` f32s from element `offset` of
/// buffer `id` (made by [`Backend::buf_create`]). Operations read and write activations
/// through these, so a GPU backend keeps them on the device between operations and the
/// host sees them only through [`Backend::upload`] and [`Backend::download`].
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Buf {
    pub id: u64,
    pub offset: u64,
    pub len: u64,
}

impl Buf {
    /// The whole of buffer `id`, `len` f32s long.
    pub fn whole(id: u64, len: usize) -> Buf {
        Buf {
            id,
            offset: 0,
            len: len as u64,
        }
    }

    /// `len` elements from `start` of this range, cut to what the range holds.
    pub fn slice(self, start: usize, len: usize) -> Buf {
        let start = (start as u64).min(self.len);
        Buf {
            id: self.id,
            offset: self.offset + start,
            len: (len as u64).min(self.len - start),
        }
    }

    /// The first `len` elements of this range (cut to what it holds).
    pub fn head(self, len: usize) -> Buf {
        self.slice(0, len)
    }

    pub fn len(self) -> usize {
        self.len as usize
    }

    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// Checks this range against a buffer of `size` elements; the error names the buffer.
    pub fn check_within(self, size: u64) -> Result<(), String> {
        match self.offset.checked_add(self.len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(format!(
                "buffer {}: range {}..+{} exceeds its {size} elements",
                self.id, self.offset, self.len
            )),
        }
    }
}

/// The host↔device traffic of one backend instance since it was created: what proves a
/// GPU backend keeps its activations on the device. The engine reads it before and after
/// a window. A host backend (the CPU's) counts the same calls; its "device" is host memory.
#[repr(C)]
#[derive(StableAbi, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferCounts {
    /// [`Backend::upload`] calls: activations sent host → device.
    pub uploads: u64,
    /// [`Backend::download`] calls: activations brought device → host.
    pub downloads: u64,
    /// Times the host blocked until the device had finished its queued work.
    pub waits: u64,
    /// Command batches handed to the device (wgpu submissions, CUDA graph or stream
    /// flushes); 0 on a host backend, which runs each operation as it is called.
    pub submissions: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Small per-operation arguments copied with the commands (token ids, positions, RoPE
    /// tables, routing rows): not activations, never waited for.
    pub param_bytes: u64,
}

impl TransferCounts {
    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: TransferCounts) -> TransferCounts {
        TransferCounts {
            uploads: self.uploads - earlier.uploads,
            downloads: self.downloads - earlier.downloads,
            waits: self.waits - earlier.waits,
            submissions: self.submissions - earlier.submissions,
            bytes_up: self.bytes_up - earlier.bytes_up,
            bytes_down: self.bytes_down - earlier.bytes_down,
            param_bytes: self.param_bytes - earlier.param_bytes,
        }
    }

    /// The sum of two backends' counts (a session with a GPU beside its CPU).
    pub fn plus(self, other: TransferCounts) -> TransferCounts {
        TransferCounts {
            uploads: self.uploads + other.uploads,
            downloads: self.downloads + other.downloads,
            waits: self.waits + other.waits,
            submissions: self.submissions + other.submissions,
            bytes_up: self.bytes_up + other.bytes_up,
            bytes_down: self.bytes_down + other.bytes_down,
            param_bytes: self.param_bytes + other.param_bytes,
        }
    }
}

/// The operations a compute backend provides.
///
/// Activations are row-major f32 with one row per token, in buffers the backend owns
/// ([`Buf`]): an operation takes handles, not host memory, so a GPU backend queues it and
/// returns; only [`Backend::download`] waits. The engine uploads a window's input once,
/// runs the window's operations and downloads its output once, as ggml's backend buffers
/// and graphs do. An operation's output range must not share a buffer with its inputs
/// (in-place operations name it once). Operations validate their arguments and return an
/// error rather than panic.
#[sabi_trait]
pub trait Backend: Send + Sync {
    /// Short name, e.g. `cpu`.
    fn name(&self) -> RString;

    /// One line for people: instruction sets, threads, memory.
    fn describe(&self) -> RString;

    /// Whether weights of this GGUF type id can be used by `matmul` and `get_rows`.
    fn supports(&self, ggml_type: u32) -> bool;

    /// Allocates an activation buffer of `len` f32s, zeroed, and returns its id.
    fn buf_create(&self, len: u64) -> BackendResult<u64>;

    /// Frees a buffer; unknown ids are ignored.
    fn buf_drop(&self, id: u64);

    /// Copies `src` (host memory, `dst.len` long) into `dst`: a window's input.
    fn upload(&self, dst: Buf, src: RSlice<'_, f32>) -> BackendResult<()>;

    /// Waits for the queued operations and copies `src` into `dst` (host memory,
    /// `src.len` long): a window's output.
    fn download(&self, src: Buf, dst: RSliceMut<'_, f32>) -> BackendResult<()>;

    /// The host↔device traffic so far ([`TransferCounts`]).
    fn transfers(&self) -> TransferCounts;

    /// `out[i] = dequantize(table row ids[i])`; `out` is `ids.len() × table.cols`.
    fn get_rows(&self, table: TensorView<'_>, ids: RSlice<'_, u32>, out: Buf) -> BackendResult<()>;

    /// `out = x · wᵀ`: `x` is `n_tokens × w.cols`, `out` is `n_tokens × w.rows`.
    fn matmul(&self, w: TensorView<'_>, x: Buf, n_tokens: u32, out: Buf) -> BackendResult<()>;

    /// RMS-normalises each row of `x` (row length = `weight.cols`) and multiplies it by the
    /// F32 `weight`.
    fn rms_norm(&self, x: Buf, weight: TensorView<'_>, eps: f32, out: Buf) -> BackendResult<()>;

    /// `acc += x`, element-wise.
    fn add(&self, acc: Buf, x: Buf) -> BackendResult<()>;

    /// Adds the F32 vector `bias` (length = row length) to every row of `x`.
    fn add_bias(&self, x: Buf, bias: TensorView<'_>) -> BackendResult<()>;

    /// `x *= s`, element-wise.
    fn scale(&self, x: Buf, s: f32) -> BackendResult<()>;

    /// Rotates each head of each row of `x` (`positions.len()` rows of `n_head × head_dim`).
    fn rope(
        &self,
        x: Buf,
        n_head: u32,
        head_dim: u32,
        positions: RSlice<'_, u32>,
        params: RopeParams<'_>,
    ) -> BackendResult<()>;

    /// `gate = silu(gate) * up`, element-wise (SwiGLU).
    fn swiglu(&self, gate: Buf, up: Buf) -> BackendResult<()>;

    /// `gate = gelu_tanh(gate) * up`, element-wise (GeGLU).
    fn geglu(&self, gate: Buf, up: Buf) -> BackendResult<()>;

    /// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`), element-wise: with
    /// `x = min(gate, limit)` and `y = clamp(up, −limit, limit)`,
    /// `gate = x / (1 + e^(−alpha·x)) · (y + 1)`. The default moves both to the host and
    /// back ([`swiglu_oai_host`]); the moves are counted.
    fn swiglu_oai(&self, gate: Buf, up: Buf, alpha: f32, limit: f32) -> BackendResult<()> {
        if gate.len != up.len {
            return RResult::RErr(
                format!(
                    "swiglu_oai: up length {} differs from gate length {}",
                    up.len, gate.len
                )
                .into(),
            );
        }
        through_host(self, &[gate, up], gate, |ins, out| {
            out.copy_from_slice(&ins[0]);
            swiglu_oai_host(out, &ins[1], alpha, limit);
            Ok(())
        })
    }

    /// `dst` row i = `src` row `rows[i]` (rows of `row_len`): a mixture of experts gathers
    /// an expert's rows. The default moves through the host, counted.
    fn gather_rows(
        &self,
        src: Buf,
        row_len: u32,
        rows: RSlice<'_, u32>,
        dst: Buf,
    ) -> BackendResult<()> {
        let rows = rows.as_slice();
        through_host(self, &[src], dst, |ins, out| {
            gather_rows_host(&ins[0], row_len as usize, rows, out)
        })
    }

    /// `dst` row `rows[i]` = `src` row i × `weights[i]` (rows of `row_len`): each expert's
    /// outputs, weighted, to their places. Rows of `dst` not named keep their values. The
    /// default moves through the host, counted.
    fn scatter_scaled(
        &self,
        src: Buf,
        row_len: u32,
        rows: RSlice<'_, u32>,
        weights: RSlice<'_, f32>,
        dst: Buf,
    ) -> BackendResult<()> {
        let (rows, weights) = (rows.as_slice(), weights.as_slice());
        through_host(self, &[src, dst], dst, |ins, out| {
            out.copy_from_slice(&ins[1]);
            scatter_scaled_host(&ins[0], row_len as usize, rows, weights, out)
        })
    }

    /// `dst` row t = `src` row `t·group` + `src` row `t·group + 1` + …, added in that order
    /// (rows of `row_len`): each token's expert terms, summed as llama.cpp sums them. The
    /// default moves through the host, counted.
    fn sum_groups(&self, src: Buf, row_len: u32, group: u32, dst: Buf) -> BackendResult<()> {
        through_host(self, &[src], dst, |ins, out| {
            sum_groups_host(&ins[0], row_len as usize, group as usize, out)
        })
    }

    /// Allocates a KV cache and returns its handle.
    fn kv_create(&self, spec: KvSpec) -> BackendResult<u64>;

    /// Frees a KV cache; unknown handles are ignored.
    fn kv_drop(&self, kv: u64);

    /// Forgets every position at or after `n_pos`.
    fn kv_truncate(&self, kv: u64, n_pos: u32) -> BackendResult<()>;

    /// For each span in turn (its `n_tokens` rows, next after the previous span's): stores
    /// its `k` and `v` rows (`n_head_kv × head_dim`) into cache `span.kv` at positions from
    /// `span.start_pos`, and writes the causal attention of its `q` rows
    /// (`n_head × head_dim_k`) to `out` (`n_head × head_dim_v`). Query heads share KV heads
    /// in groups (grouped-query attention). `params`' `n_tokens` and `start_pos` are
    /// ignored (each span has its own); a continuous-batching step has one span per request.
    fn attention_spans(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: Buf,
        k: Buf,
        v: Buf,
        params: AttentionParams,
        out: Buf,
    ) -> BackendResult<()>;

    /// [`Backend::attention_spans`] with attention sinks (gpt-oss): `sinks` holds one
    /// logit per query head (`n_head` long) that joins each softmax's denominator — the
    /// max is taken over the scores and the sink, and `e^(sink − max)` is added to the
    /// sum — but weights no value, so a head may attend to nothing. The default refuses by
    /// name: a backend without it cannot run a model that has sinks.
    fn attention_spans_sinks(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: Buf,
        k: Buf,
        v: Buf,
        sinks: RSlice<'_, f32>,
        params: AttentionParams,
        out: Buf,
    ) -> BackendResult<()> {
        let _ = (spans, q, k, v, sinks, params, out);
        RResult::RErr(
            format!(
                "attention with sinks (gpt-oss's attn_sinks) is not supported by the {} backend",
                self.name()
            )
            .into(),
        )
    }

    /// A hint that no operation follows for a while (a ring device has passed its
    /// activations on and waits for the next round): release the cores now, e.g. put
    /// worker threads to sleep instead of letting them poll for the next operation.
    fn idle(&self);
}

/// Runs `f` on the host for an operation a backend has no kernel for: downloads `inputs`,
/// gives them and a host copy of `output` to `f`, and uploads the result into `output`.
/// Every move is a counted [`Backend::download`] / [`Backend::upload`].
pub fn through_host<B: Backend + ?Sized>(
    be: &B,
    inputs: &[Buf],
    output: Buf,
    f: impl FnOnce(&[Vec<f32>], &mut [f32]) -> Result<(), String>,
) -> BackendResult<()> {
    let mut ins = Vec::with_capacity(inputs.len());
    for &b in inputs {
        let mut host = vec![0f32; b.len()];
        if let RResult::RErr(e) = be.download(b, RSliceMut::from_mut_slice(&mut host)) {
            return RResult::RErr(e);
        }
        ins.push(host);
    }
    let mut out = vec![0f32; output.len()];
    if let Err(e) = f(&ins, &mut out) {
        return RResult::RErr(e.into());
    }
    be.upload(output, RSlice::from_slice(&out))
}

/// [`Backend::gather_rows`] on host slices.
pub fn gather_rows_host(
    src: &[f32],
    row_len: usize,
    rows: &[u32],
    dst: &mut [f32],
) -> Result<(), String> {
    if row_len == 0 || dst.len() != rows.len() * row_len {
        return Err(format!(
            "gather_rows: destination length {} is not {} rows of {row_len}",
            dst.len(),
            rows.len()
        ));
    }
    let n_src = src.len() / row_len;
    for (out, &r) in dst.chunks_exact_mut(row_len).zip(rows) {
        let r = r as usize;
        if r >= n_src {
            return Err(format!(
                "gather_rows: row {r} is past the source's {n_src} rows"
            ));
        }
        out.copy_from_slice(&src[r * row_len..(r + 1) * row_len]);
    }
    Ok(())
}

/// [`Backend::scatter_scaled`] on host slices: `dst` row `rows[i]` = `src` row i × `weights[i]`.
pub fn scatter_scaled_host(
    src: &[f32],
    row_len: usize,
    rows: &[u32],
    weights: &[f32],
    dst: &mut [f32],
) -> Result<(), String> {
    if row_len == 0 || src.len() != rows.len() * row_len || weights.len() != rows.len() {
        return Err(format!(
            "scatter_scaled: source length {} and {} weights do not make {} rows of {row_len}",
            src.len(),
            weights.len(),
            rows.len()
        ));
    }
    let n_dst = dst.len() / row_len;
    for ((row, &r), &w) in src.chunks_exact(row_len).zip(rows).zip(weights) {
        let r = r as usize;
        if r >= n_dst {
            return Err(format!(
                "scatter_scaled: row {r} is past the destination's {n_dst} rows"
            ));
        }
        for (o, &y) in dst[r * row_len..(r + 1) * row_len].iter_mut().zip(row) {
            *o = y * w;
        }
    }
    Ok(())
}

/// [`Backend::sum_groups`] on host slices: `dst` row t = Σ_j `src` row `t·group + j`, in order.
pub fn sum_groups_host(
    src: &[f32],
    row_len: usize,
    group: usize,
    dst: &mut [f32],
) -> Result<(), String> {
    if row_len == 0 || group == 0 || src.len() != dst.len() * group {
        return Err(format!(
            "sum_groups: source length {} is not {group} × the destination's {}",
            src.len(),
            dst.len()
        ));
    }
    for (out, terms) in dst
        .chunks_exact_mut(row_len)
        .zip(src.chunks_exact(row_len * group))
    {
        out.copy_from_slice(&terms[..row_len]);
        for term in terms.chunks_exact(row_len).skip(1) {
            for (o, &v) in out.iter_mut().zip(term) {
                *o += v;
            }
        }
    }
    Ok(())
}

/// The clamped SwiGLU of [`Backend::swiglu_oai`] over `gate` and `up` (the shorter
/// length), computed as ggml's CPU backend does: `e^x` by the platform's `expf`, a
/// multiply and an add per step, no fused multiply-add.
pub fn swiglu_oai_host(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let y = u.max(-limit).min(limit);
        *g = x / (1.0 + (alpha * -x).exp()) * (y + 1.0);
    }
}

/// An owned backend instance behind the ABI.
pub type BackendBox = Backend_TO<'static, RBox<()>>;

/// The root module a backend plugin exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = BackendPluginRef)))]
#[sabi(missing_field(panic))]
pub struct BackendPlugin {
    /// The plugin's name, e.g. `cpu`.
    pub name: extern "C" fn() -> RString,
    /// The plugin crate's own version.
    pub plugin_version: extern "C" fn() -> RString,
    /// Creates a backend instance.
    #[sabi(last_prefix_field)]
    pub create: extern "C" fn(BackendConfig) -> BackendResult<BackendBox>,
    /// Whether this machine can run the backend at all, asked without creating one:
    /// `None` if it can, else why not (e.g. `libcuda.so not found`). Cheap; never panics.
    /// Appended after the prefix, so plugins built before it still load (as available).
    #[sabi(missing_field(option))]
    pub unavailable: extern "C" fn() -> ROption<RString>,
    /// The GPU's memory, asked without creating a backend: `None` for a backend that is
    /// not a GPU's (the CPU's) or cannot run here. A plugin answering `Some` is a GPU
    /// plugin: `--gpu-layers` and `prima profile` pick it without being told its name.
    /// Appended after `unavailable`, so plugins built before it still load (as no GPU).
    #[sabi(missing_field(option))]
    pub gpu_memory: extern "C" fn() -> ROption<GpuMemory>,
}

impl RootModule for BackendPluginRef {
    declare_root_module_statics! {BackendPluginRef}
    const BASE_NAME: &'static str = "prima_backend";
    const NAME: &'static str = "prima_backend";
    const VERSION_STRINGS: VersionStrings = package_version_strings!();
}

/// Exports a backend plugin from a `cdylib` crate.
///
/// ```ignore
/// prima_abi::export_backend_plugin!(name = "cpu", create = my_create_fn);
/// ```
/// where `my_create_fn: extern "C" fn(BackendConfig) -> BackendResult<BackendBox>`.
/// A backend that needs hardware or a driver also names
/// `unavailable = my_probe_fn` (`extern "C" fn() -> ROption<RString>`, see
/// [`BackendPlugin::unavailable`]); without it the plugin is always available. A GPU's
/// backend also names `gpu_memory = my_memory_fn` (`extern "C" fn() ->
/// ROption<GpuMemory>`, see [`BackendPlugin::gpu_memory`]).
#[macro_export]
macro_rules! export_backend_plugin {
    (name = $name:expr, create = $create:path, unavailable = $unavailable:path) => {
        extern "C" fn __prima_plugin_no_gpu_memory(
        ) -> ::abi_stable::std_types::ROption<$crate::backend::GpuMemory> {
            ::abi_stable::std_types::ROption::RNone
        }
        $crate::export_backend_plugin!(
            name = $name,
            create = $create,
            unavailable = $unavailable,
            gpu_memory = __prima_plugin_no_gpu_memory
        );
    };
    (name = $name:expr, create = $create:path) => {
        extern "C" fn __prima_plugin_always_available(
        ) -> ::abi_stable::std_types::ROption<::abi_stable::std_types::RString> {
            ::abi_stable::std_types::ROption::RNone
        }
        $crate::export_backend_plugin!(
            name = $name,
            create = $create,
            unavailable = __prima_plugin_always_available
        );
    };
    (name = $name:expr, create = $create:path, unavailable = $unavailable:path, gpu_memory = $gpu_memory:path) => {
        /// Read by the loader with plain `libloading` before any `abi_stable` check.
        #[no_mangle]
        pub extern "C" fn prima_plugin_abi_version() -> u32 {
            match option_env!("PRIMA_FAKE_PLUGIN_ABI_VERSION") {
                // Only the plugin-ABI test builds a plugin with this set, to show refusal.
                Some(v) => $crate::parse_fake_abi_version(v),
                None => $crate::backend::BACKEND_ABI_VERSION,
            }
        }

        /// Which kind of plugin this library is.
        #[no_mangle]
        pub extern "C" fn prima_plugin_kind() -> u32 {
            $crate::PluginKind::Backend as u32
        }

        extern "C" fn __prima_plugin_name() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from($name)
        }

        extern "C" fn __prima_plugin_version() -> ::abi_stable::std_types::RString {
            ::abi_stable::std_types::RString::from(env!("CARGO_PKG_VERSION"))
        }

        #[::abi_stable::export_root_module]
        pub fn __prima_backend_root() -> $crate::backend::BackendPluginRef {
            use ::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::backend::BackendPlugin {
                name: __prima_plugin_name,
                plugin_version: __prima_plugin_version,
                create: $create,
                unavailable: $unavailable,
                gpu_memory: $gpu_memory,
            }
            .leak_into_prefix()
        }
    };
}

#[cfg(test)]
mod rope_table_tests {
    use super::RopeParams;
    use abi_stable::std_types::{ROption, RSlice};

    fn params(freq_factors: Option<&[f32]>) -> RopeParams<'_> {
        RopeParams {
            n_rot: 8,
            freq_base: 10_000.0,
            freq_scale: 1.0,
            neox: false,
            freq_factors: match freq_factors {
                Some(f) => ROption::RSome(RSlice::from_slice(f)),
                None => ROption::RNone,
            },
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 4096,
        }
    }

    #[test]
    fn position_zero_is_the_identity_and_pair_zero_turns_by_the_position() {
        let t = params(None).cos_sin_table(&[0, 3], 8);
        assert_eq!(t.len(), 2 * 8);
        for cs in t[..8].chunks_exact(2) {
            assert_eq!(cs, [1.0, 0.0]);
        }
        // Pair 0 of position 3: θ = 3.
        assert_eq!(&t[8..10], &[3.0f32.cos(), 3.0f32.sin()]);
        // Pair 1: θ = 3 · 10000^(−1/4).
        let theta = 3.0 * 10_000f32.powf(-2.0 / 8.0);
        assert_eq!(&t[10..12], &[theta.cos(), theta.sin()]);
    }

    #[test]
    fn frequency_factors_divide_the_angle() {
        let f = [1.0, 2.0, 4.0, 8.0];
        let t = params(Some(&f)).cos_sin_table(&[5], 8);
        let theta = 5.0 * 10_000f32.powf(-2.0 / 8.0) * 10_000f32.powf(-2.0 / 8.0);
        assert_eq!(t[4], (theta / 4.0).cos());
    }
}
