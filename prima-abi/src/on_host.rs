//! The backend's operations on host slices, for tests and one-off callers: each call
//! uploads its inputs into fresh buffers, runs the operation, downloads the output and
//! frees the buffers. Version 4 of the ABI had this shape; the engine never uses it,
//! since it pays a round trip per operation.

// Attention with sinks takes its operands one by one, as the trait does.
#![allow(clippy::too_many_arguments)]

use abi_stable::std_types::{RResult, RSlice, RSliceMut};

use crate::backend::{
    AttentionParams, AttentionSpan, Backend, BackendResult, Buf, RopeParams, TensorView,
};

/// A backend driven through host slices (see the module's documentation).
pub struct OnHost<'a, B: Backend + ?Sized>(pub &'a B);

macro_rules! tryr {
    ($e:expr) => {
        match $e {
            RResult::ROk(v) => v,
            RResult::RErr(e) => return RResult::RErr(e),
        }
    };
}

impl<B: Backend + ?Sized> OnHost<'_, B> {
    /// Uploads `inputs` into buffers, and `out` too when the operation reads it
    /// (`in_place`); runs `f` on them; downloads `out`; frees every buffer.
    fn run(
        &self,
        inputs: &[&[f32]],
        out: &mut [f32],
        in_place: bool,
        f: impl FnOnce(&[Buf], Buf) -> BackendResult<()>,
    ) -> BackendResult<()> {
        let be = self.0;
        let mut made = Vec::with_capacity(inputs.len() + 1);
        let result = (|| {
            let mut bufs = Vec::with_capacity(inputs.len());
            for x in inputs {
                let id = tryr!(be.buf_create(x.len() as u64));
                made.push(id);
                let b = Buf::whole(id, x.len());
                tryr!(be.upload(b, RSlice::from_slice(x)));
                bufs.push(b);
            }
            let id = tryr!(be.buf_create(out.len() as u64));
            made.push(id);
            let o = Buf::whole(id, out.len());
            if in_place {
                tryr!(be.upload(o, RSlice::from_slice(out)));
            }
            tryr!(f(&bufs, o));
            be.download(o, RSliceMut::from_mut_slice(out))
        })();
        for id in made {
            be.buf_drop(id);
        }
        result
    }

    pub fn get_rows(
        &self,
        table: TensorView<'_>,
        ids: RSlice<'_, u32>,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[], &mut out, false, |_, o| self.0.get_rows(table, ids, o))
    }

    pub fn matmul(
        &self,
        w: TensorView<'_>,
        x: RSlice<'_, f32>,
        n_tokens: u32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[&x], &mut out, false, |b, o| {
            self.0.matmul(w, b[0], n_tokens, o)
        })
    }

    pub fn rms_norm(
        &self,
        x: RSlice<'_, f32>,
        weight: TensorView<'_>,
        eps: f32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[&x], &mut out, false, |b, o| {
            self.0.rms_norm(b[0], weight, eps, o)
        })
    }

    pub fn add(&self, mut acc: RSliceMut<'_, f32>, x: RSlice<'_, f32>) -> BackendResult<()> {
        self.run(&[&x], &mut acc, true, |b, o| self.0.add(o, b[0]))
    }

    pub fn add_bias(&self, mut x: RSliceMut<'_, f32>, bias: TensorView<'_>) -> BackendResult<()> {
        self.run(&[], &mut x, true, |_, o| self.0.add_bias(o, bias))
    }

    pub fn scale(&self, mut x: RSliceMut<'_, f32>, s: f32) -> BackendResult<()> {
        self.run(&[], &mut x, true, |_, o| self.0.scale(o, s))
    }

    pub fn rope(
        &self,
        mut x: RSliceMut<'_, f32>,
        n_head: u32,
        head_dim: u32,
        positions: RSlice<'_, u32>,
        params: RopeParams<'_>,
    ) -> BackendResult<()> {
        self.run(&[], &mut x, true, |_, o| {
            self.0.rope(o, n_head, head_dim, positions, params)
        })
    }

    pub fn swiglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.run(&[&up], &mut gate, true, |b, o| self.0.swiglu(o, b[0]))
    }

    pub fn geglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.run(&[&up], &mut gate, true, |b, o| self.0.geglu(o, b[0]))
    }

    pub fn swiglu_oai(
        &self,
        mut gate: RSliceMut<'_, f32>,
        up: RSlice<'_, f32>,
        alpha: f32,
        limit: f32,
    ) -> BackendResult<()> {
        self.run(&[&up], &mut gate, true, |b, o| {
            self.0.swiglu_oai(o, b[0], alpha, limit)
        })
    }

    pub fn gather_rows(
        &self,
        src: RSlice<'_, f32>,
        row_len: u32,
        rows: RSlice<'_, u32>,
        mut dst: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[&src], &mut dst, false, |b, o| {
            self.0.gather_rows(b[0], row_len, rows, o)
        })
    }

    pub fn scatter_scaled(
        &self,
        src: RSlice<'_, f32>,
        row_len: u32,
        rows: RSlice<'_, u32>,
        weights: RSlice<'_, f32>,
        mut dst: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[&src], &mut dst, true, |b, o| {
            self.0.scatter_scaled(b[0], row_len, rows, weights, o)
        })
    }

    pub fn sum_groups(
        &self,
        src: RSlice<'_, f32>,
        row_len: u32,
        group: u32,
        mut dst: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[&src], &mut dst, false, |b, o| {
            self.0.sum_groups(b[0], row_len, group, o)
        })
    }

    /// One request's attention: `params.n_tokens` rows at `params.start_pos` of cache `kv`.
    pub fn attention(
        &self,
        kv: u64,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        params: AttentionParams,
        out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        let span = AttentionSpan {
            kv,
            n_tokens: params.n_tokens,
            start_pos: params.start_pos,
        };
        self.attention_spans(RSlice::from_slice(&[span]), q, k, v, params, out)
    }

    pub fn attention_spans(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        params: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[&q, &k, &v], &mut out, false, |b, o| {
            self.0.attention_spans(spans, b[0], b[1], b[2], params, o)
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub fn attention_spans_sinks(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        sinks: RSlice<'_, f32>,
        params: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.run(&[&q, &k, &v], &mut out, false, |b, o| {
            self.0
                .attention_spans_sinks(spans, b[0], b[1], b[2], sinks, params, o)
        })
    }
}
