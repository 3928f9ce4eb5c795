//! Experts as the unit of residency: what the engine tells a residency policy about the
//! experts a mixture-of-experts layer uses, and where each expert's bytes lie in the file.
//!
//! The engine decides nothing here. Its per-expert loop (`moe.rs`) calls the session's
//! [`ExpertPolicy`], if it has one, twice: once a layer's routing is known (before any
//! expert's product, so the policy can read ahead the chosen experts it does not keep),
//! and after each expert's down-projection (so it can release a streamed expert at once,
//! MRU). Which experts stay resident is the policy's choice (`prima_cluster::prp`);
//! [`ExpertUse`] is the use count it keeps, cheap enough for the hot path (relaxed
//! atomic adds, one per chosen expert per layer per step).
//!
//! A hook changes no bit of the result: it only hints the page cache.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::gguf::TensorInfo;
use crate::model::Model;

/// Which experts a layer's router chose for one batch, and for how many rows each, with
/// the rows the router saw.
#[derive(Debug, Clone, Copy)]
pub struct Routing<'a> {
    /// Prefix sums: expert `e` has `start[e + 1] − start[e]` rows (0: not chosen).
    start: &'a [usize],
    /// The block's input rows (the normed residual stream), `n × n_embd`.
    input: &'a [f32],
}

impl<'a> Routing<'a> {
    /// The routing whose expert `e` has `start[e + 1] − start[e]` rows, of the rows
    /// `input` (empty where they do not matter).
    pub fn from_starts(start: &'a [usize], input: &'a [f32]) -> Routing<'a> {
        Routing { start, input }
    }

    /// The rows the router saw, one after another (a policy may apply the next layer's
    /// router to them to guess its experts).
    pub fn input(&self) -> &'a [f32] {
        self.input
    }

    /// The layer's expert count.
    pub fn n_expert(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    /// Rows routed to expert `e`.
    pub fn rows(&self, e: usize) -> usize {
        match (self.start.get(e), self.start.get(e + 1)) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    /// The chosen experts (at least one row), in index order, the order they are
    /// computed in, with their row counts.
    pub fn chosen(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.n_expert())
            .map(|e| (e, self.rows(e)))
            .filter(|&(_, rows)| rows > 0)
    }
}

/// What a residency policy hears from the per-expert loop of a MoE layer. Both calls
/// run on the compute thread, between backend operations: they must be quick (queue a
/// read, give a page hint), never block on the disk.
pub trait ExpertPolicy: Send + Sync {
    /// Layer `layer`'s router has chosen `routing`'s experts; their products follow, in
    /// index order.
    fn routed(&self, layer: usize, routing: Routing<'_>);

    /// Expert `expert` of layer `layer` is about to run its products (a policy may wait
    /// here for its weights to be read). Nothing by default.
    fn computing(&self, layer: usize, expert: usize) {
        let _ = (layer, expert);
    }

    /// Expert `expert` of layer `layer` has run its down-projection: this batch reads it
    /// no more.
    fn computed(&self, layer: usize, expert: usize);
}

/// Per-layer, per-expert use counts: how many rows each expert was routed, counted as
/// requests run. Shared by every session of a device (relaxed atomics: a count is a
/// statistic, not a synchronisation).
#[derive(Debug)]
pub struct ExpertUse {
    n_expert: usize,
    counts: Box<[AtomicU64]>,
}

impl ExpertUse {
    pub fn new(n_layers: usize, n_expert: usize) -> ExpertUse {
        ExpertUse {
            n_expert,
            counts: (0..n_layers * n_expert)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    pub fn n_layers(&self) -> usize {
        self.counts.len().checked_div(self.n_expert).unwrap_or(0)
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Adds `routing`'s rows to layer `layer`'s counts (a layer out of range is ignored).
    pub fn record(&self, layer: usize, routing: Routing<'_>) {
        if layer >= self.n_layers() {
            return;
        }
        let counts = &self.counts[layer * self.n_expert..(layer + 1) * self.n_expert];
        for (e, rows) in routing.chosen() {
            if let Some(c) = counts.get(e) {
                c.fetch_add(rows as u64, Ordering::Relaxed);
            }
        }
    }

    /// Layer `layer`'s counts, one per expert (empty when out of range).
    pub fn layer(&self, layer: usize) -> Vec<u64> {
        if layer >= self.n_layers() {
            return Vec::new();
        }
        self.counts[layer * self.n_expert..(layer + 1) * self.n_expert]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Every layer's counts.
    pub fn snapshot(&self) -> Vec<Vec<u64>> {
        (0..self.n_layers()).map(|il| self.layer(il)).collect()
    }

    /// Adds counts gathered elsewhere (another device, an earlier run): `counts[il][e]`.
    pub fn merge(&self, counts: &[Vec<u64>]) {
        for (il, layer) in counts.iter().enumerate().take(self.n_layers()) {
            for (e, &n) in layer.iter().enumerate().take(self.n_expert) {
                self.counts[il * self.n_expert + e].fetch_add(n, Ordering::Relaxed);
            }
        }
    }
}

/// The `e`-th slab of the 3-D expert tensor `t`, as file bytes.
fn slab(t: &TensorInfo, e: usize) -> Range<u64> {
    let n_expert = t.dims.get(2).copied().unwrap_or(1).max(1);
    let size = t.n_bytes / n_expert;
    let start = t.offset + e as u64 * size;
    start..start + size
}

impl Model {
    /// The file bytes of expert `e` of layer `il`: its slab of `ffn_gate_exps`,
    /// `ffn_up_exps` and `ffn_down_exps`, in that order (empty for a dense layer or an
    /// expert out of range). Slabs are not page aligned: the first and last pages of one
    /// may hold a neighbour's bytes, which is why releases narrow a range to the pages
    /// it covers whole ([`crate::gguf::GgufFile::advise_pages`]).
    pub fn expert_ranges(&self, il: usize, e: usize) -> Vec<Range<u64>> {
        match (self.layers.get(il).map(|l| &l.ffn), self.experts()) {
            (Some(crate::model::FeedForward::Moe(m)), Some(shape)) if e < shape.n_expert => {
                [&m.gate_exps, &m.up_exps, &m.down_exps]
                    .into_iter()
                    .map(|t| slab(t, e))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// Layer `il`'s router (`ffn_gate_inp`, `[n_embd, n_expert]`), `None` for a dense
    /// layer.
    pub fn router(&self, il: usize) -> Option<&TensorInfo> {
        match self.layers.get(il).map(|l| &l.ffn) {
            Some(crate::model::FeedForward::Moe(m)) => Some(&m.router),
            _ => None,
        }
    }

    /// Bytes of one expert of layer `il` (0 for a dense layer).
    pub fn expert_bytes(&self, il: usize) -> u64 {
        self.expert_ranges(il, 0)
            .iter()
            .map(|r| r.end - r.start)
            .sum()
    }

    /// Bytes of layer `il` outside its experts: attention, norms and the router, what a
    /// token always reads ([`Model::layer_bytes`] for a dense layer).
    pub fn layer_shared_bytes(&self, il: usize) -> u64 {
        let n_expert = self.experts().map_or(0, |e| e.n_expert) as u64;
        self.layer_bytes(il)
            .saturating_sub(n_expert * self.expert_bytes(il))
    }

    /// The tensors of layer `il` outside its experts.
    pub fn layer_shared_tensors(&self, il: usize) -> impl Iterator<Item = &TensorInfo> {
        let experts: Vec<u64> = match self.layers.get(il).map(|l| &l.ffn) {
            Some(crate::model::FeedForward::Moe(m)) => {
                vec![m.gate_exps.offset, m.up_exps.offset, m.down_exps.offset]
            }
            _ => Vec::new(),
        };
        self.layer_tensors(il)
            .filter(move |t| !experts.contains(&t.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_lists_the_chosen_experts_with_their_rows() {
        let start = [0usize, 2, 2, 5, 6];
        let r = Routing::from_starts(&start, &[]);
        assert_eq!(r.n_expert(), 4);
        assert_eq!(r.chosen().collect::<Vec<_>>(), [(0, 2), (2, 3), (3, 1)]);
        assert_eq!(r.rows(9), 0);
    }

    #[test]
    fn use_counts_add_rows_per_layer_and_merge() {
        let u = ExpertUse::new(2, 4);
        let start = [0usize, 2, 2, 5, 6];
        u.record(1, Routing::from_starts(&start, &[]));
        u.record(1, Routing::from_starts(&start, &[]));
        u.record(7, Routing::from_starts(&start, &[]));
        assert_eq!(u.layer(0), [0, 0, 0, 0]);
        assert_eq!(u.layer(1), [4, 0, 6, 2]);
        u.merge(&[vec![1, 1, 1, 1], vec![0, 9], vec![5]]);
        assert_eq!(u.snapshot(), [vec![1, 1, 1, 1], vec![4, 9, 6, 2]]);
        assert!(u.layer(2).is_empty());
    }

    #[test]
    fn an_expert_is_its_slab_of_each_tensor() {
        let t = TensorInfo {
            name: "blk.0.ffn_up_exps.weight".into(),
            dims: vec![8, 4, 3],
            ggml_type: prima_abi::GgmlType::F32,
            offset: 1000,
            n_bytes: 8 * 4 * 3 * 4,
        };
        assert_eq!(slab(&t, 0), 1000..1128);
        assert_eq!(slab(&t, 2), 1256..1384);
    }
}
