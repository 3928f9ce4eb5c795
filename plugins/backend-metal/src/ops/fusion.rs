//! Operations held back one call, so that the next operation can take them into its own
//! dispatch. On a CPU adapter a dispatch costs about 0.05 ms whatever it computes (lavapipe
//! wakes its threads and waits for them); each fusion here saves one per layer or two,
//! with the same arithmetic in the same order (the same bits). A generated token's layer
//! of a Llama-like model is then five dispatches on a CPU adapter (docs/backends.md):
//!
//! - `add(x, h)` then `rms_norm(x, w, h)`, the residual stream's step: one kernel adds,
//!   normalises and writes both (`add_rms_norm*`);
//! - a norm then a matmul of its output with Q8_0 or Q8_1 activations: the norm kernel
//!   also quantizes them (`*rms_norm_q8_*`), in place of the matmul's quantize dispatch;
//! - `swiglu(gate, up)` then a matmul of `gate`: the quantize kernel applies SwiGLU first
//!   (`quantize_swiglu_*`);
//! - `rope(q)` then `rope(k)` of the same positions: both in one dispatch (`rope_pair`),
//!   which also stores k and v into the KV cache where attention follows
//!   (`rope_pair_store`, in place of `store_f16`);
//! - on CPU adapters, attention then a matmul of its output with Q8_0 or Q8_1 activations:
//!   attention quantizes each head's output too (`attention_narrow_q8_*`);
//! - on CPU adapters, a q, k, v projection held as one matmul group, then `rope(q)`,
//!   `rope(k)` and attention: the group's kernel turns q and k and stores k and v into the
//!   KV cache, a head a workgroup (`rowmatmul_*_seg3_rope_*`, heads of 64);
//! - on CPU adapters, a gate and up projection held as one matmul group, then `swiglu` of
//!   their outputs, then the down projection: one kernel computes both, applies SwiGLU
//!   and quantizes the down projection's input (`rowmatmul_*_seg2_swiglu_q8_*`);
//! - on CPU adapters, a one-weight matmul group writing h, then `add(x, h)` and
//!   `rms_norm(x, w, h)`, then a matmul of h: the group's last workgroup to finish adds,
//!   normalises and quantizes (`rowmatmul_*_norm_q8_*`);
//! - on CPU adapters, a generated token's matmuls of the same activations whose weights
//!   follow one another in a texture page (q, k, v; gate, up: `texel_pages`): one
//!   dispatch of up to three weights, each row stored to its own output
//!   ([`MatmulGroup`], `rowmatmul_*_seg{2,3}_*`).
//!
//! At most one operation is held (a chain counts as one: `GateUp`). Every other
//! operation, download and buffer change
//! dispatches it first (`State::guarded`), so the device runs the operations in the order
//! they were called; checks are done when an operation is called, so its errors are too.

use prima_abi::backend::Buf;

use super::State;
use crate::formats::Activation;
use crate::kernels::{LegacyRows, ACT_UNIFORM_BYTES, MAX_SEGMENTS, ROPE_HEAD, WG};
use prima_abi::backend::AttentionParams;
use prima_gpu_support::checks::OpResult;

/// An operation recorded but not yet dispatched.
pub(super) enum Deferred {
    /// `acc += x`.
    Add {
        acc: Buf,
        x: Buf,
    },
    Norm(Norm),
    /// `gate = silu(gate) · up`.
    Swiglu {
        gate: Buf,
        up: Buf,
    },
    Rope(Rope),
    /// q's and k's RoPE, held for attention to store k and v in the same dispatch.
    RopePair(Rope, Rope),
    Matmul(MatmulGroup),
    Attention(AttentionCall),
    /// A q, k, v projection's group, then the RoPE of q and, once called, of k.
    QkvRope {
        group: MatmulGroup,
        q: Rope,
        k: Option<Rope>,
    },
    /// A gate and up projection's group, then `swiglu(gate, up)` of its outputs.
    GateUp {
        group: MatmulGroup,
        gate: Buf,
        up: Buf,
    },
    /// A one-weight group writing `h`, then `add(acc, h)`.
    MatmulAdd {
        group: MatmulGroup,
        acc: Buf,
        h: Buf,
    },
    /// That, then the RMS norm of `acc` into `h` (`norm`, its residual `h`).
    MatmulNorm {
        group: MatmulGroup,
        norm: Norm,
    },
}

impl Deferred {
    /// The quantized activations a held matmul reads, where it is one: a matmul that
    /// quantizes the next one's input writes them elsewhere.
    pub(super) fn matmul_input(&self) -> Option<&wgpu::Buffer> {
        match self {
            Deferred::Matmul(g)
            | Deferred::QkvRope { group: g, .. }
            | Deferred::GateUp { group: g, .. }
            | Deferred::MatmulAdd { group: g, .. }
            | Deferred::MatmulNorm { group: g, .. } => Some(&g.input),
            _ => None,
        }
    }
}

/// One attention dispatch, recorded as `attention_spans` made it: kernel, its uniform's
/// fields (without the quantized output's offsets), q, K cache, V cache, output and
/// scores buffers, grid; and the output's range with its head size.
pub(super) struct AttentionCall {
    pub kernel: &'static str,
    pub params: [u32; 11],
    pub buffers: [wgpu::Buffer; 5],
    pub groups: [u32; 3],
    pub out: Buf,
    pub dv: u32,
}

/// A span's new keys and values into the F16 KV cache, as `store_f16` takes them: the k
/// cache and the word its rows start at; v's words, source (buffer, element offset),
/// cache and the word they start at.
pub(super) struct KvStore {
    pub kc: wgpu::Buffer,
    pub k_at: u32,
    pub v_words: u32,
    pub v: (wgpu::Buffer, u32),
    pub vc: wgpu::Buffer,
    pub v_at: u32,
}

/// What the `_rope` kernel takes beyond a matmul group: the RoPE table, the KV caches and
/// this token's words in them, NeoX or not.
struct RopeExtra {
    table: crate::params::Placed,
    kc: wgpu::Buffer,
    vc: wgpu::Buffer,
    kc_off: u32,
    vc_off: u32,
    neox: bool,
}

/// The quantized activations' key (`State::quantized`'s).
pub(super) type ActKey = Option<(u64, u64, u64, Activation)>;

/// One token's matmuls by an unrolled texel kernel, held to be dispatched as one: weights
/// whose rows follow one another in one texture page, against the same activations.
pub(super) struct MatmulGroup {
    pub variant: LegacyRows,
    pub format: &'static str,
    pub page: wgpu::TextureView,
    /// The first weight's first row in the page, and the rows of all.
    pub tex0: u32,
    pub rows: u32,
    /// cols, row_bytes, d_off, s_off (the same for all).
    pub shape: [u32; 4],
    /// The quantized activations (a uniform binding) and whose they are.
    pub input: wgpu::Buffer,
    pub act_key: ActKey,
    /// Each weight's first row among `rows` and its output: buffer and element offset.
    pub outputs: Vec<(u32, wgpu::Buffer, u32)>,
}

impl MatmulGroup {
    /// Whether `next` can join: the same kernel and activations, its rows right after
    /// these in the same page, room for one more output, and an output buffer of its own.
    fn takes(&self, next: &MatmulGroup) -> bool {
        self.variant == next.variant
            && self.format == next.format
            && self.page == next.page
            && self.tex0 + self.rows == next.tex0
            && self.shape == next.shape
            && self.input == next.input
            && self.act_key == next.act_key
            && (self.outputs.len() as u32) < MAX_SEGMENTS
            && self.outputs.iter().all(|o| o.1 != next.outputs[0].1)
    }

    /// Whether output `i` is `buf` from element `off`.
    fn writes(&self, i: usize, (buf, off): (&wgpu::Buffer, u32)) -> bool {
        self.outputs
            .get(i)
            .is_some_and(|o| &o.1 == buf && o.2 == off)
    }

    /// The rows of output `i` (0 past the last).
    fn rows_of(&self, i: usize) -> u32 {
        let start = |i: usize| self.outputs.get(i).map_or(self.rows, |o| o.0);
        match self.outputs.get(i) {
            Some(_) => start(i + 1) - start(i),
            None => 0,
        }
    }

    /// Whether `rope` turns this q, k, v group's output `i` (q: 0, k: 1) as the `_rope`
    /// kernel can: one token, whole heads of ROPE_HEAD, v's heads the same size.
    fn ropes(&self, i: usize, rope: &Rope, x: (&wgpu::Buffer, u32)) -> bool {
        self.outputs.len() == 3
            && self.writes(i, x)
            && rope.n_tokens == 1
            && rope.n_rot == ROPE_HEAD
            && rope.head_dim == ROPE_HEAD
            && rope.n_head * ROPE_HEAD == self.rows_of(i)
            && self.rows_of(2).is_multiple_of(ROPE_HEAD)
    }

    /// Whether the group is a gate projection to `gate` and an up projection to `up`, a
    /// token each, of equal rows in whole blocks of 32: what the SwiGLU kernel takes.
    fn is_gate_up(&self, gate: (&wgpu::Buffer, u32), up: (&wgpu::Buffer, u32), n: u64) -> bool {
        let half = self.rows / 2;
        matches!(&self.outputs[..], [g, u]
            if (&g.1, g.2) == gate && (&u.1, u.2) == up && u.0 == half)
            && self.rows == 2 * half
            && half as u64 == n
            && half.is_multiple_of(32)
    }
}

/// One RoPE call, checked: `x` (element offset `x_off`) of `n_tokens` rows of `n_head`
/// heads, turned by the host's cos/sin `table`.
pub(super) struct Rope {
    pub x: Buf,
    pub x_off: u32,
    pub n_head: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    pub neox: bool,
    pub n_tokens: u32,
    pub table: Vec<f32>,
}

/// `out = rms_norm(x) · weight` over rows of `n`, after `x += residual` where there is one
/// (its range lies in `out`'s buffer).
pub(super) struct Norm {
    x: Buf,
    residual: Option<Buf>,
    weight: wgpu::Buffer,
    n: u32,
    eps: f32,
    out: Buf,
}

/// Where a matmul wants its quantized activations (the `Act` scratch's layout).
pub(super) struct QuantTarget {
    pub act: Activation,
    pub buf: wgpu::Buffer,
    pub d_off: u32,
    pub s_off: u32,
}

impl State {
    /// Holds `d` back, dispatching what was held before. Whatever `d` writes is about to
    /// change, so no quantized activations are kept.
    pub(super) fn defer(&mut self, d: Deferred) -> OpResult<()> {
        self.flush_deferred()?;
        self.quantized = None;
        self.deferred = Some(d);
        Ok(())
    }

    /// Dispatches the held operation, if any, on its own.
    pub(super) fn flush_deferred(&mut self) -> OpResult<()> {
        match self.deferred.take() {
            None => Ok(()),
            Some(Deferred::Add { acc, x }) => self.binary_act("add", acc, x),
            Some(Deferred::Swiglu { gate, up }) => self.binary_act("swiglu", gate, up),
            Some(Deferred::Norm(norm)) => self.dispatch_norm(norm, None),
            Some(Deferred::Rope(rope)) => self.dispatch_rope(rope, None, None),
            Some(Deferred::RopePair(q, k)) => self.dispatch_rope(q, Some(k), None),
            Some(Deferred::Matmul(group)) => self.dispatch_matmul_group(group, None),
            Some(Deferred::Attention(call)) => self.dispatch_attention(call, None),
            Some(Deferred::QkvRope { group, q, k }) => {
                self.dispatch_matmul_group(group, None)?;
                self.dispatch_rope(q, k, None)
            }
            Some(Deferred::GateUp { group, gate, up }) => {
                self.dispatch_matmul_group(group, None)?;
                self.binary_act("swiglu", gate, up)
            }
            Some(Deferred::MatmulAdd { group, acc, h }) => {
                self.dispatch_matmul_group(group, None)?;
                self.binary_act("add", acc, h)
            }
            Some(Deferred::MatmulNorm { group, norm }) => {
                self.dispatch_matmul_group(group, None)?;
                self.dispatch_norm(norm, None)
            }
        }
    }

    /// The attention kernel of `call`, its output also quantized into `quant` where given.
    pub(super) fn dispatch_attention(
        &mut self,
        call: AttentionCall,
        quant: Option<QuantTarget>,
    ) -> OpResult<()> {
        let (d_off, s_off) = quant.as_ref().map_or((0, 0), |q| (q.d_off, q.s_off));
        let mut params = call.params.to_vec();
        params.extend([d_off, s_off]);
        let kernel = match &quant {
            None => call.kernel.to_string(),
            Some(q) if q.act == Activation::Q8_1 => format!("{}_q8_1", call.kernel),
            Some(_) => format!("{}_q8_0", call.kernel),
        };
        let mut bindings: Vec<(u32, wgpu::BindingResource<'_>)> = call
            .buffers
            .iter()
            .zip(1..)
            .map(|(b, i)| (i, b.as_entire_binding()))
            .collect();
        if let Some(q) = &quant {
            bindings.push((6, q.buf.as_entire_binding()));
        }
        self.dispatch(&kernel, &params, &bindings, call.groups)
    }

    /// Holds a generated token's texel matmul: joined to the held group where it can be,
    /// else after dispatching what was held. The quantized activations stay (its input).
    pub(super) fn hold_matmul(&mut self, call: MatmulGroup) -> OpResult<()> {
        if let Some(Deferred::Matmul(group)) = &mut self.deferred {
            if group.takes(&call) {
                let [(_, buf, off)] =
                    <[_; 1]>::try_from(call.outputs).map_err(|_| "a matmul call has one output")?;
                group.outputs.push((group.rows, buf, off));
                group.rows += call.rows;
                return Ok(());
            }
        }
        self.flush_deferred()?;
        self.deferred = Some(Deferred::Matmul(call));
        Ok(())
    }

    /// One dispatch of `group`'s weights, each row to its weight's output; with `swiglu`,
    /// a gate and up projection's (`MatmulGroup::is_gate_up`) with SwiGLU applied and
    /// quantized there.
    fn dispatch_matmul_group(
        &mut self,
        group: MatmulGroup,
        swiglu: Option<QuantTarget>,
    ) -> OpResult<()> {
        self.dispatch_group_with(group, swiglu, None, None)
    }

    /// [`State::dispatch_matmul_group`], or with `rope` the q, k, v group's `_rope` kernel.
    fn dispatch_group_with(
        &mut self,
        group: MatmulGroup,
        swiglu: Option<QuantTarget>,
        rope: Option<RopeExtra>,
        norm: Option<(Norm, QuantTarget)>,
    ) -> OpResult<()> {
        let segments = group.outputs.len() as u32;
        let kernel = LegacyRows {
            segments,
            swiglu: swiglu.as_ref().map(|q| q.act == Activation::Q8_1),
            rope: rope.is_some(),
            norm: norm.as_ref().map(|(_, q)| q.act == Activation::Q8_1),
            ..group.variant
        }
        .name(group.format);
        let [cols, row_bytes, d_off, s_off] = group.shape;
        // The SwiGLU and norm kernels' input offsets are constants: P.d_off, P.s_off are
        // their output's.
        let quant = swiglu.as_ref().or(norm.as_ref().map(|(_, q)| q));
        let (d_off, s_off) = quant.map_or((d_off, s_off), |q| (q.d_off, q.s_off));
        let (x_buf, x_off) = match &norm {
            Some((n, _)) => {
                let (b, off) = self.act("rms_norm", "x", n.x)?;
                (Some(b), off)
            }
            None => (None, 0),
        };
        let counter = norm.as_ref().map(|_| self.counter());
        let start = |i: usize| group.outputs.get(i).map_or(group.rows, |o| o.0);
        let offset = |i: usize| group.outputs.get(i).map_or(0, |o| o.2);
        let params = [
            cols,
            group.rows,
            row_bytes,
            1,
            0,
            group.rows,
            d_off,
            s_off,
            offset(0),
            0,
            group.tex0,
            start(1),
            start(2),
            offset(1),
            offset(2),
            rope.as_ref().map_or(0, |r| r.kc_off),
            rope.as_ref().map_or(0, |r| r.vc_off),
            rope.as_ref().map_or(0, |r| u32::from(r.neox)),
            x_off,
            norm.as_ref().map_or(0, |(n, _)| n.eps.to_bits()),
        ];
        let mut bindings = vec![
            (4, wgpu::BindingResource::TextureView(&group.page)),
            (
                2,
                wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &group.input,
                    offset: 0,
                    size: std::num::NonZeroU64::new(ACT_UNIFORM_BYTES),
                }),
            ),
        ];
        for (i, (_, buf, _)) in group.outputs.iter().enumerate() {
            let binding = if i == 0 { 3 } else { 4 + i as u32 };
            bindings.push((binding, buf.as_entire_binding()));
        }
        if let Some(r) = &rope {
            bindings.push((7, r.table.binding()));
            bindings.push((8, r.kc.as_entire_binding()));
            bindings.push((9, r.vc.as_entire_binding()));
        }
        if let (Some((n, q)), Some(x), Some(c)) = (&norm, &x_buf, &counter) {
            bindings.push((6, q.buf.as_entire_binding()));
            bindings.push((7, x.as_entire_binding()));
            bindings.push((8, n.weight.as_entire_binding()));
            bindings.push((9, c.as_entire_binding()));
        }
        // A workgroup per 64 rows, or per 32 of each projection with SwiGLU.
        let groups = match &swiglu {
            Some(q) => {
                bindings.push((6, q.buf.as_entire_binding()));
                group.rows / 64
            }
            None => group.rows.div_ceil(WG),
        };
        let [gx, gy] = self.grid(groups as u64)?;
        self.dispatch(&kernel, &params, &bindings, [gx, gy, 1])
    }

    /// A RoPE call: dispatched with a held one of the same table and head size in
    /// another buffer (q, then k), else held back.
    pub(super) fn rope_or_pair(&mut self, rope: Rope) -> OpResult<()> {
        // With a held q, k, v projection: its `_rope` kernel may take both.
        let x = self.act("rope", "x", rope.x)?;
        let x = (&x.0, x.1);
        match &mut self.deferred {
            Some(Deferred::Matmul(group)) if group.ropes(0, &rope, x) => {
                if let Some(Deferred::Matmul(group)) = self.deferred.take() {
                    self.deferred = Some(Deferred::QkvRope {
                        group,
                        q: rope,
                        k: None,
                    });
                }
                self.quantized = None;
                return Ok(());
            }
            Some(Deferred::QkvRope {
                group,
                q,
                k: k @ None,
            }) if group.ropes(1, &rope, x) && q.neox == rope.neox && q.table == rope.table => {
                *k = Some(rope);
                return Ok(());
            }
            _ => {}
        }
        let pairs = match &self.deferred {
            Some(Deferred::Rope(first)) => {
                first.x.id != rope.x.id
                    && first.head_dim == rope.head_dim
                    && first.n_rot == rope.n_rot
                    && first.neox == rope.neox
                    && first.n_tokens == rope.n_tokens
                    && first.table == rope.table
            }
            _ => false,
        };
        match (pairs, self.deferred.take()) {
            (true, Some(Deferred::Rope(first))) => {
                self.deferred = Some(Deferred::RopePair(first, rope));
                Ok(())
            }
            (_, held) => {
                self.deferred = held;
                self.defer(Deferred::Rope(rope))
            }
        }
    }

    /// The held q, k, v projection with both RoPEs if its k and v outputs are `k` and `v`
    /// and attention's heads are the `_rope` kernel's.
    pub(super) fn take_qkv_rope_of(
        &mut self,
        k: (&wgpu::Buffer, u32),
        v: (&wgpu::Buffer, u32),
        p: &AttentionParams,
    ) -> Option<(MatmulGroup, Rope)> {
        let fits = match &self.deferred {
            Some(Deferred::QkvRope {
                group, k: Some(_), ..
            }) => {
                group.writes(1, k)
                    && group.writes(2, v)
                    && p.head_dim_k == ROPE_HEAD
                    && p.head_dim_v == ROPE_HEAD
                    && group.rows_of(1) == p.n_head_kv * ROPE_HEAD
                    && group.rows_of(2) == p.n_head_kv * ROPE_HEAD
            }
            _ => false,
        };
        match self.take_held_if(fits) {
            Some(Deferred::QkvRope { group, q, .. }) => Some((group, q)),
            _ => None,
        }
    }

    /// The held operation, taken if `fits` (the caller's check of it); else left held.
    fn take_held_if(&mut self, fits: bool) -> Option<Deferred> {
        if fits {
            self.deferred.take()
        } else {
            None
        }
    }

    /// The q, k, v group's `_rope` kernel: the projections, q's and k's RoPE by `q`'s
    /// table, k and v into the KV cache at `store`'s words.
    pub(super) fn dispatch_qkv_rope(
        &mut self,
        group: MatmulGroup,
        q: Rope,
        store: KvStore,
    ) -> OpResult<()> {
        let table = self
            .params
            .push(&self.gpu.device, bytemuck::cast_slice(&q.table));
        let extra = RopeExtra {
            table,
            kc: store.kc,
            vc: store.vc,
            kc_off: store.k_at,
            vc_off: store.v_at,
            neox: q.neox,
        };
        self.dispatch_group_with(group, None, Some(extra), None)
    }

    /// The held RoPE pair if its second is of `k` and can store it as `store` wants: whole
    /// heads turned (NeoX pairs two apart), `k_heads` heads of `k_dim` over `n_tokens`.
    pub(super) fn take_rope_pair_of(
        &mut self,
        k: Buf,
        k_heads: u32,
        k_dim: u32,
        n_tokens: u32,
    ) -> Option<(Rope, Rope)> {
        let fits = match &self.deferred {
            Some(Deferred::RopePair(_, r)) => {
                r.x == k
                    && r.n_head == k_heads
                    && r.head_dim == k_dim
                    && r.n_tokens == n_tokens
                    && r.n_rot == r.head_dim
                    && r.head_dim.is_multiple_of(2)
                    && (!r.neox || r.n_rot.is_multiple_of(4))
            }
            _ => false,
        };
        match self.take_held_if(fits) {
            Some(Deferred::RopePair(q, k)) => Some((q, k)),
            _ => None,
        }
    }

    /// The rope kernel over `rope`, and over `second` by the same table (`rope_pair`);
    /// with `store`, `second` (k) and v also into the KV cache (`rope_pair_store`).
    pub(super) fn dispatch_rope(
        &mut self,
        rope: Rope,
        second: Option<Rope>,
        store: Option<KvStore>,
    ) -> OpResult<()> {
        const OP: &str = "rope";
        let x_buf = self.act(OP, "x", rope.x)?.0;
        let table_at = self
            .params
            .push(&self.gpu.device, bytemuck::cast_slice(&rope.table));
        let pairs_of = |r: &Rope| r.n_tokens as u64 * r.n_head as u64 * (r.n_rot / 2) as u64;
        // Storing, a NeoX invocation of k takes two pairs (whole words of the cache).
        let second_items = |r: &Rope| match (&store, r.neox) {
            (Some(_), true) => pairs_of(r) / 2,
            _ => pairs_of(r),
        };
        let v_words = store.as_ref().map_or(0, |s| s.v_words);
        let total = pairs_of(&rope) + second.as_ref().map_or(0, second_items) + v_words as u64;
        let groups = self.grid_1d(total)?;
        let (n_head2, x2_off) = second.as_ref().map_or((0, 0), |r| (r.n_head, r.x_off));
        let (k_at, v_at, v_src) = store
            .as_ref()
            .map_or((0, 0, 0), |s| (s.k_at, s.v_at, s.v.1));
        let params = [
            rope.n_tokens,
            rope.n_head,
            rope.head_dim,
            rope.n_rot,
            u32::from(rope.neox),
            rope.x_off,
            n_head2,
            x2_off,
            k_at,
            v_words,
            v_at,
            v_src,
        ];
        let mut bindings = vec![(1, x_buf.as_entire_binding()), (2, table_at.binding())];
        let x2_buf = match &second {
            Some(r) => Some(self.act(OP, "x", r.x)?.0),
            None => None,
        };
        if let Some(b) = &x2_buf {
            bindings.push((3, b.as_entire_binding()));
        }
        if let Some(s) = &store {
            bindings.push((4, s.kc.as_entire_binding()));
            bindings.push((5, s.v.0.as_entire_binding()));
            bindings.push((6, s.vc.as_entire_binding()));
        }
        let kernel = match (&second, &store) {
            (Some(_), Some(_)) => "rope_pair_store",
            (Some(_), None) => "rope_pair",
            _ => "rope",
        };
        self.dispatch(kernel, &params, &bindings, groups)
    }

    /// `acc += x` (checked), held back.
    pub(super) fn defer_add(&mut self, acc: Buf, x: Buf) -> OpResult<()> {
        // After a held one-weight group that wrote x whole: the group's kernel may do it.
        let h = self.act("add", "x", x)?;
        if let Some(Deferred::Matmul(group)) = &self.deferred {
            if group.outputs.len() == 1
                && group.writes(0, (&h.0, h.1))
                && group.rows as u64 == x.len
            {
                if let Some(Deferred::Matmul(group)) = self.deferred.take() {
                    self.deferred = Some(Deferred::MatmulAdd { group, acc, h: x });
                    self.quantized = None;
                    return Ok(());
                }
            }
        }
        self.defer(Deferred::Add { acc, x })
    }

    /// `swiglu(gate, up)` (checked), held back: with the held gate and up projection
    /// where it wrote them (`GateUp`).
    pub(super) fn defer_swiglu(&mut self, gate: Buf, up: Buf) -> OpResult<()> {
        let (gate_buf, gate_off) = self.act("swiglu", "gate", gate)?;
        let (up_buf, up_off) = self.act("swiglu", "up", up)?;
        if let Some(Deferred::Matmul(group)) = &self.deferred {
            if group.is_gate_up((&gate_buf, gate_off), (&up_buf, up_off), gate.len) {
                if let Some(Deferred::Matmul(group)) = self.deferred.take() {
                    self.deferred = Some(Deferred::GateUp { group, gate, up });
                    self.quantized = None;
                    return Ok(());
                }
            }
        }
        self.defer(Deferred::Swiglu { gate, up })
    }

    /// An RMS norm (checked; `weight` on the device), held back; it takes in a held
    /// `add(x, h)` whose `h` lies in `out`'s buffer.
    pub(super) fn defer_rms_norm(
        &mut self,
        x: Buf,
        weight: wgpu::Buffer,
        n: u32,
        eps: f32,
        out: Buf,
    ) -> OpResult<()> {
        if let Some(Deferred::MatmulAdd { group, acc, h }) = &self.deferred {
            if *acc == x && *h == out && n == group.rows {
                if let Some(Deferred::MatmulAdd { group, h, .. }) = self.deferred.take() {
                    let norm = Norm {
                        x,
                        residual: Some(h),
                        weight,
                        n,
                        eps,
                        out,
                    };
                    self.deferred = Some(Deferred::MatmulNorm { group, norm });
                    self.quantized = None;
                    return Ok(());
                }
            }
        }
        let residual = match self.deferred {
            Some(Deferred::Add { acc, x: h }) if acc == x && h.id == out.id => {
                self.deferred = None;
                Some(h)
            }
            _ => None,
        };
        let norm = Norm {
            x,
            residual,
            weight,
            n,
            eps,
            out,
        };
        self.defer(Deferred::Norm(norm))
    }

    /// The held operation if it writes a matmul's input `x` whole and can quantize it as
    /// `act` on the way (taken: the matmul dispatches it through [`State::quantize_from`]);
    /// `None` leaves it held.
    pub(super) fn take_producer_of(&mut self, x: Buf, act: Activation) -> Option<Deferred> {
        if !matches!(act, Activation::Q8_0 | Activation::Q8_1) {
            return None;
        }
        let fits = match &self.deferred {
            Some(Deferred::Norm(norm)) => norm.out == x && norm.n.is_multiple_of(32),
            Some(Deferred::Swiglu { gate, .. }) => *gate == x && x.len.is_multiple_of(32),
            Some(Deferred::Attention(a)) => a.out == x && a.dv.is_multiple_of(32),
            Some(Deferred::GateUp { gate, .. }) => *gate == x,
            Some(Deferred::MatmulNorm { norm, .. }) => norm.out == x && norm.n.is_multiple_of(32),
            _ => false,
        };
        self.take_held_if(fits)
    }

    /// Dispatches `producer` (from [`State::take_producer_of`]) with its output quantized
    /// into `to`.
    pub(super) fn quantize_from(&mut self, producer: Deferred, to: QuantTarget) -> OpResult<()> {
        match producer {
            Deferred::Attention(call) => self.dispatch_attention(call, Some(to)),
            Deferred::GateUp { group, .. } => self.dispatch_matmul_group(group, Some(to)),
            Deferred::MatmulNorm { group, norm } => {
                self.dispatch_group_with(group, None, None, Some((norm, to)))
            }
            Deferred::Norm(norm) => self.dispatch_norm(norm, Some(to)),
            Deferred::Swiglu { gate, up } => {
                const OP: &str = "swiglu";
                let (gate_buf, gate_off) = self.act(OP, "gate", gate)?;
                let (up_buf, up_off) = self.act(OP, "up", up)?;
                let n_blocks = (gate.len / 32) as u32;
                let kernel = match to.act {
                    Activation::Q8_1 => "quantize_swiglu_q8_1",
                    _ => "quantize_swiglu_q8_0",
                };
                let (kernel, groups) = self.quantize_grid(kernel, n_blocks)?;
                self.dispatch(
                    &kernel,
                    &[n_blocks, to.d_off, to.s_off, gate_off, up_off],
                    &[
                        (1, gate_buf.as_entire_binding()),
                        (2, to.buf.as_entire_binding()),
                        (3, up_buf.as_entire_binding()),
                    ],
                    groups,
                )
            }
            Deferred::Add { .. }
            | Deferred::MatmulAdd { .. }
            | Deferred::QkvRope { .. }
            | Deferred::Rope(_)
            | Deferred::RopePair(..)
            | Deferred::Matmul(_) => Err("only a norm or SwiGLU quantizes a matmul's input".into()),
        }
    }

    /// The norm kernel for `norm`: with its residual added first where it has one, and
    /// its output quantized into `quant` where given.
    fn dispatch_norm(&mut self, norm: Norm, quant: Option<QuantTarget>) -> OpResult<()> {
        const OP: &str = "rms_norm";
        let (x_buf, x_off) = self.act(OP, "x", norm.x)?;
        let (out_buf, out_off) = self.act(OP, "out", norm.out)?;
        let h_off = match norm.residual {
            Some(h) => self.act(OP, "residual", h)?.1,
            None => 0,
        };
        let rows = (norm.x.len / norm.n as u64) as u32;
        let [gx, gy] = self.grid(rows as u64)?;
        let kernel = format!(
            "{}{}rms_norm{}",
            if self.row_per_invocation {
                "narrow_"
            } else {
                ""
            },
            if norm.residual.is_some() { "add_" } else { "" },
            match &quant {
                None => "",
                Some(q) if q.act == Activation::Q8_1 => "_q8_1",
                Some(_) => "_q8_0",
            }
        );
        let (d_off, s_off) = quant.as_ref().map_or((0, 0), |q| (q.d_off, q.s_off));
        let params = [
            norm.n,
            norm.eps.to_bits(),
            rows,
            x_off,
            out_off,
            h_off,
            d_off,
            s_off,
        ];
        let mut bindings = vec![
            (1, x_buf.as_entire_binding()),
            (2, norm.weight.as_entire_binding()),
            (3, out_buf.as_entire_binding()),
        ];
        if let Some(q) = &quant {
            bindings.push((5, q.buf.as_entire_binding()));
        }
        self.dispatch(&kernel, &params, &bindings, [gx, gy, 1])
    }
}
