//! The feed-forward block of a decoder layer, behind one interface: the rows of the
//! normed residual stream in, the block's output rows out, in place.
//!
//! The rows are a backend buffer ([`Buf`]): a block's products stay on the backend; only
//! the router's logits come to the host, where the experts are chosen.
//!
//! A block differs in kind between architectures, not in a flag: a dense block
//! ([`DenseFfn`]) runs one gated MLP over every row; a mixture of experts
//! ([`MoeFfn`](moe::MoeFfn)) routes each row to a few of its experts. Each kind is
//! its own code; [`FeedForward`] only says which one a layer has. The norm before the
//! block and the residual add after it are the layer's, shared by both kinds.

mod experts;
mod moe;

use crate::gguf::TensorInfo;
use crate::model::arch::FfnActivation;
use crate::model::backend_call::op;
use crate::model::{ExpertParams, HyperParams, Model, ModelError};
pub use experts::{ExpertPolicy, ExpertUse, Routing};
pub use moe::{ExpertBiases, MoeFfn};
use moe::{MoeBufs, MoeHost};
use prima_abi::backend::{BackendBox, Buf};

/// What a feed-forward block computes with: the backend of the layer's side, the model
/// whose mapping holds the weights, the gate's activation, the layer's index and the
/// session's expert residency policy, if any.
#[derive(Clone, Copy)]
pub(crate) struct FfnContext<'a> {
    pub be: &'a BackendBox,
    pub model: &'a Model,
    pub act: FfnActivation,
    pub layer: usize,
    pub experts: Option<&'a dyn ExpertPolicy>,
}

impl FfnContext<'_> {
    /// `gate = act(gate) * up`, the gated activation of every kind of block.
    pub fn gated(&self, gate: Buf, up: Buf) -> Result<(), ModelError> {
        match self.act {
            FfnActivation::Silu => op(self.be.swiglu(gate, up), "swiglu"),
            FfnActivation::GeluTanh => op(self.be.geglu(gate, up), "geglu"),
            FfnActivation::SwigluOai => op(
                self.be
                    .swiglu_oai(gate, up, FfnActivation::OAI_ALPHA, FfnActivation::OAI_LIMIT),
                "swiglu_oai",
            ),
        }
    }

    /// Tells the policy the layer's routing of the rows `input` (before the experts'
    /// products).
    pub fn routed(&self, start: &[usize], input: &[f32]) {
        if let Some(p) = self.experts {
            p.routed(self.layer, Routing::from_starts(start, input));
        }
    }

    /// Tells the policy expert `e`'s products come next.
    pub fn computing(&self, e: usize) {
        if let Some(p) = self.experts {
            p.computing(self.layer, e);
        }
    }

    /// Tells the policy expert `e` has run its down-projection.
    pub fn computed(&self, e: usize) {
        if let Some(p) = self.experts {
            p.computed(self.layer, e);
        }
    }
}

/// A layer's feed-forward block.
#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(DenseFfn),
    Moe(MoeFfn),
}

impl FeedForward {
    /// Replaces the `n` rows of `h` (`n × n_embd`, the normed residual stream) by the
    /// block's output, in the buffers `bufs` of the layer's backend.
    pub(crate) fn forward(
        &self,
        cx: FfnContext<'_>,
        h: Buf,
        n: usize,
        bufs: &FfnBufs,
        host: &mut FfnHost,
    ) -> Result<(), ModelError> {
        match self {
            FeedForward::Dense(ffn) => ffn.forward(cx, h, n, bufs),
            FeedForward::Moe(ffn) => ffn.forward(cx, h, n, bufs, &mut host.moe),
        }
    }

    /// The block's weight tensors.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        let (dense, moe, biases) = match self {
            FeedForward::Dense(f) => (Some([&f.gate, &f.up, &f.down]), None, None),
            FeedForward::Moe(f) => (
                None,
                Some([&f.router, &f.gate_exps, &f.up_exps, &f.down_exps]),
                f.biases
                    .as_ref()
                    .map(|b| [&b.router, &b.gate, &b.up, &b.down]),
            ),
        };
        dense
            .into_iter()
            .flatten()
            .chain(moe.into_iter().flatten())
            .chain(biases.into_iter().flatten())
    }
}

/// One gated MLP over every row: `down(act(gate · h) * (up · h))`.
#[derive(Debug, Clone)]
pub struct DenseFfn {
    pub gate: TensorInfo,
    pub up: TensorInfo,
    pub down: TensorInfo,
}

impl DenseFfn {
    fn forward(&self, cx: FfnContext<'_>, h: Buf, n: usize, s: &FfnBufs) -> Result<(), ModelError> {
        let (be, model) = (cx.be, cx.model);
        let ff = self.gate.rows() as usize;
        let nt = n as u32;
        let (gate, up) = (s.gate.head(n * ff), s.up.head(n * ff));
        op(
            be.matmul(model.view(&self.gate), h, nt, gate),
            "matmul ffn_gate",
        )?;
        op(be.matmul(model.view(&self.up), h, nt, up), "matmul ffn_up")?;
        cx.gated(gate, up)?;
        op(
            be.matmul(model.view(&self.down), gate, nt, h),
            "matmul ffn_down",
        )
    }
}

/// The feed-forward block's buffers on one backend for batches of up to `n_batch` rows,
/// allocated once per session.
pub(crate) struct FfnBufs {
    /// Gate and up projections (dense: `n × n_ff`; experts: their rows × `n_ff_exp`).
    pub gate: Buf,
    pub up: Buf,
    /// Routing and per-expert buffers (empty for a dense model).
    pub moe: MoeBufs,
}

impl FfnBufs {
    /// Allocates with `alloc` (a length in f32s to a buffer of the layer's backend).
    pub fn new(
        alloc: &mut impl FnMut(usize) -> Result<Buf, ModelError>,
        hp: &HyperParams,
        experts: Option<ExpertParams>,
        n_batch: usize,
    ) -> Result<FfnBufs, ModelError> {
        let width = experts.map_or(hp.n_ff, |e| e.n_ff_exp);
        Ok(FfnBufs {
            gate: alloc(n_batch * width)?,
            up: alloc(n_batch * width)?,
            moe: match experts {
                Some(e) => MoeBufs::new(alloc, hp.n_embd, e, n_batch)?,
                None => MoeBufs::default(),
            },
        })
    }
}

/// What the feed-forward blocks compute on the host, shared by a session's backends: the
/// experts' routing.
pub(crate) struct FfnHost {
    moe: MoeHost,
}

impl FfnHost {
    pub fn new(experts: Option<ExpertParams>, n_batch: usize) -> FfnHost {
        FfnHost {
            moe: experts.map_or_else(MoeHost::default, |e| MoeHost::new(e, n_batch)),
        }
    }
}
