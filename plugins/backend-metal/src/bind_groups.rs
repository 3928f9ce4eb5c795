//! Bind groups made once and reused: creating one per dispatch is a large part of a
//! dispatch's fixed cost on lavapipe (wgpu's validation and tracking, then a descriptor
//! set written by the driver). A token's dispatches repeat the last token's — the same
//! kernels over the same activation, weight and KV buffers, with their arguments at the
//! same offsets of the parameter arena (it starts over after each wait) — so the bind
//! groups made for one token serve the next.
//!
//! A cached bind group holds its buffers alive: the cache is cleared when a buffer it
//! may name is let go (`buf_drop`, `kv_drop`, a scratch buffer replaced) and when it grows
//! past [`MAX_ENTRIES`].

use std::collections::HashMap;

/// Bind groups kept at most; a token of a large model needs a few thousand.
const MAX_ENTRIES: usize = 16 * 1024;

/// One binding as a key: the buffer range or texture view it names.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Bound {
    Buffer(wgpu::Buffer, u64, Option<u64>),
    Texture(wgpu::TextureView),
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    kernel: String,
    bindings: Vec<(u32, Bound)>,
}

/// The bind groups made so far, by kernel and bindings.
#[derive(Default)]
pub struct BindGroups {
    groups: HashMap<Key, wgpu::BindGroup>,
    /// Bind groups made and reused, for the profile.
    pub made: u64,
    pub reused: u64,
}

impl BindGroups {
    /// The bind group of `pipeline` (kernel `kernel`) for `entries`, made on first use
    /// (each time where an entry is of a kind the cache does not key).
    pub fn get(
        &mut self,
        device: &wgpu::Device,
        kernel: &str,
        pipeline: &wgpu::ComputePipeline,
        entries: &[wgpu::BindGroupEntry<'_>],
    ) -> wgpu::BindGroup {
        let make = || {
            device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel),
                layout: &pipeline.get_bind_group_layout(0),
                entries,
            })
        };
        let Some(key) = key_of(kernel, entries) else {
            self.made += 1;
            return make();
        };
        if let Some(g) = self.groups.get(&key) {
            self.reused += 1;
            return g.clone();
        }
        if self.groups.len() >= MAX_ENTRIES {
            self.groups.clear();
        }
        self.made += 1;
        let g = make();
        self.groups.insert(key, g.clone());
        g
    }

    /// Forgets every bind group (a buffer they may name is being let go).
    pub fn clear(&mut self) {
        self.groups.clear();
    }
}

fn key_of(kernel: &str, entries: &[wgpu::BindGroupEntry<'_>]) -> Option<Key> {
    let bindings = entries
        .iter()
        .map(|e| {
            let bound = match &e.resource {
                wgpu::BindingResource::Buffer(b) => {
                    Bound::Buffer(b.buffer.clone(), b.offset, b.size.map(|s| s.get()))
                }
                wgpu::BindingResource::TextureView(v) => Bound::Texture((*v).clone()),
                _ => return None,
            };
            Some((e.binding, bound))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Key {
        kernel: kernel.to_string(),
        bindings,
    })
}
