//! The activation buffers of ABI v5 ([`Buf`]), which on the CPU are plain host memory:
//! each is a `Vec<f32>` behind its own mutex, named by a `u64` id.
//!
//! An operation resolves its [`Buf`]s to slices through [`BufferStore::with`], which
//! locks each distinct buffer once (in id order, so two operations never wait on each
//! other in a cycle), checks every range, and hands the kernel `&[f32]` inputs and one
//! `&mut [f32]` output. The kernels in `crate::ops` then run on those slices exactly as
//! they ran on the host slices of ABI v4: the CPU pays no copy beyond the one upload of a
//! window's input and the one download of its output. This module is not for kernels or
//! transfer counting (see `crate::backend`).

use crate::ops::kv_cache::lock;
use crate::ops::OpResult;
use prima_abi::backend::Buf;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Most buffers one operation names (attention: q, k, v and out).
const MAX_BUFS: usize = 4;

type Shared = Arc<Mutex<Vec<f32>>>;

/// Every live activation buffer of one backend.
#[derive(Default)]
pub struct BufferStore {
    next: AtomicU64,
    buffers: Mutex<HashMap<u64, Shared, BuildHasherDefault<IdHasher>>>,
}

/// Hashes a buffer id by one multiply (Fx's constant): ids are consecutive integers
/// chosen here, so SipHash's defence against chosen keys buys nothing, and every
/// operation looks up to four of them.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl BufferStore {
    /// Allocates a zeroed buffer of `len` f32s and returns its id (ids start at 1).
    pub fn create(&self, len: u64) -> OpResult<u64> {
        let too_big = || format!("buf_create: cannot allocate a buffer of {len} f32s");
        let n = usize::try_from(len).map_err(|_| too_big())?;
        // Zeroed by the allocator (calloc; fresh pages from the OS for large buffers), not
        // by writing zeros: a buffer sized for the largest batch then takes memory only as
        // its rows are used. Writing them made the head of a ring, which computes nothing,
        // hold 49 MB of scratch (8% of a 590 MB device's memory: the ring's own pressure).
        let data: Vec<f32> = bytemuck::allocation::try_zeroed_vec(n).map_err(|_| too_big())?;
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.buffers).insert(id, Arc::new(Mutex::new(data)));
        Ok(id)
    }

    /// Frees buffer `id`; unknown ids are ignored. An operation still running on it keeps
    /// its memory until it returns.
    pub fn drop_buffer(&self, id: u64) {
        lock(&self.buffers).remove(&id);
    }

    /// Copies `src` into the range `dst`; the lengths must agree.
    pub fn upload(&self, dst: Buf, src: &[f32]) -> OpResult<()> {
        check_host_len("upload", dst, src.len())?;
        self.with("upload", [], dst, |[], out| {
            out.copy_from_slice(src);
            Ok(())
        })
    }

    /// Copies the range `src` into `dst`; the lengths must agree.
    pub fn download(&self, src: Buf, dst: &mut [f32]) -> OpResult<()> {
        check_host_len("download", src, dst.len())?;
        let buffer = self.get("download", src.id)?;
        let data = lock(&buffer);
        dst.copy_from_slice(range("download", &data, src)?);
        Ok(())
    }

    /// Runs `f` on the slices of `inputs` and of `output` for operation `op`. Inputs may
    /// share a buffer (q, k and v cut from one); the output's buffer may not be an input's,
    /// since it is borrowed mutably (an in-place operation names its buffer once, as the
    /// output). Errors name the operation and the buffer: an unknown id, a range past the
    /// buffer's end, an output aliasing an input.
    pub fn with<const N: usize, R>(
        &self,
        op: &str,
        inputs: [Buf; N],
        output: Buf,
        f: impl FnOnce([&[f32]; N], &mut [f32]) -> OpResult<R>,
    ) -> OpResult<R> {
        if let Some(b) = inputs.iter().find(|b| b.id == output.id) {
            return Err(format!(
                "{op}: output buffer {} is also an input ({}..+{}); an in-place operation names it once",
                output.id, b.offset, b.len
            ));
        }
        if N + 1 > MAX_BUFS {
            return Err(format!("{op}: {N} input buffers, at most {}", MAX_BUFS - 1));
        }
        // The distinct ids, ascending: the lock order.
        let mut ids = [0u64; MAX_BUFS];
        ids[0] = output.id;
        ids[1..=N].copy_from_slice(&inputs.map(|b| b.id));
        let ids = &mut ids[..=N];
        ids.sort_unstable();
        let mut n_ids = 0;
        for i in 0..ids.len() {
            if i == 0 || ids[i] != ids[n_ids - 1] {
                ids[n_ids] = ids[i];
                n_ids += 1;
            }
        }
        let ids = &ids[..n_ids];

        let mut shared: [Option<Shared>; MAX_BUFS] = Default::default();
        {
            let map = lock(&self.buffers);
            for (slot, id) in shared.iter_mut().zip(ids) {
                let buffer = map
                    .get(id)
                    .ok_or_else(|| format!("{op}: unknown buffer {id}"))?;
                *slot = Some(Arc::clone(buffer));
            }
        }
        let mut guards: [Option<MutexGuard<'_, Vec<f32>>>; MAX_BUFS] = Default::default();
        for (guard, buffer) in guards.iter_mut().zip(&shared) {
            *guard = buffer.as_ref().map(|b| lock(b));
        }

        let at = |id: u64| ids.iter().position(|&x| x == id).unwrap_or(MAX_BUFS);
        let mut out_guard = guards
            .get_mut(at(output.id))
            .and_then(Option::take)
            .ok_or_else(|| format!("{op}: unknown buffer {}", output.id))?;
        let mut views: [&[f32]; N] = [&[]; N];
        for (view, b) in views.iter_mut().zip(&inputs) {
            let data = guards
                .get(at(b.id))
                .and_then(Option::as_ref)
                .ok_or_else(|| format!("{op}: unknown buffer {}", b.id))?;
            *view = range(op, data, *b)?;
        }
        let out = range_mut(op, &mut out_guard, output)?;
        f(views, out)
    }

    fn get(&self, op: &str, id: u64) -> OpResult<Shared> {
        lock(&self.buffers)
            .get(&id)
            .cloned()
            .ok_or_else(|| format!("{op}: unknown buffer {id}"))
    }
}

/// The elements of `data` that `b` names, or an error naming the buffer.
fn range<'a>(op: &str, data: &'a [f32], b: Buf) -> OpResult<&'a [f32]> {
    b.check_within(data.len() as u64)
        .map_err(|e| format!("{op}: {e}"))?;
    let start = b.offset as usize;
    Ok(&data[start..start + b.len()])
}

/// [`range`], mutably.
fn range_mut<'a>(op: &str, data: &'a mut [f32], b: Buf) -> OpResult<&'a mut [f32]> {
    b.check_within(data.len() as u64)
        .map_err(|e| format!("{op}: {e}"))?;
    let start = b.offset as usize;
    Ok(&mut data[start..start + b.len()])
}

/// A transfer's host slice must be as long as its buffer range.
fn check_host_len(op: &str, b: Buf, host: usize) -> OpResult<()> {
    if b.len == host as u64 {
        Ok(())
    } else {
        Err(format!(
            "{op}: host slice of {host} f32s for buffer {}'s range of {}",
            b.id, b.len
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_may_share_a_buffer_and_each_is_locked_once() {
        let store = BufferStore::default();
        let a = store.create(6).unwrap();
        let o = store.create(2).unwrap();
        store
            .upload(Buf::whole(a, 6), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
            .unwrap();
        let whole = Buf::whole(a, 6);
        store
            .with(
                "sum",
                [whole.slice(0, 2), whole.slice(2, 2), whole.slice(4, 2)],
                Buf::whole(o, 2),
                |[x, y, z], out| {
                    for i in 0..2 {
                        out[i] = x[i] + y[i] + z[i];
                    }
                    Ok(())
                },
            )
            .unwrap();
        let mut got = [0f32; 2];
        store.download(Buf::whole(o, 2), &mut got).unwrap();
        assert_eq!(got, [9.0, 12.0]);
    }

    #[test]
    fn zero_length_buffers_and_ranges_work() {
        let store = BufferStore::default();
        let e = store.create(0).unwrap();
        store.upload(Buf::whole(e, 0), &[]).unwrap();
        store.download(Buf::whole(e, 0), &mut []).unwrap();
        let b = store.create(3).unwrap();
        store
            .with(
                "noop",
                [Buf::whole(e, 0)],
                Buf::whole(b, 3).slice(3, 0),
                |[x], out| {
                    assert!(x.is_empty() && out.is_empty());
                    Ok(())
                },
            )
            .unwrap();
    }

    #[test]
    fn a_dropped_buffer_is_unknown() {
        let store = BufferStore::default();
        let b = store.create(1).unwrap();
        store.drop_buffer(b);
        store.drop_buffer(b);
        assert_eq!(
            store.download(Buf::whole(b, 1), &mut [0.0]).unwrap_err(),
            format!("download: unknown buffer {b}")
        );
    }

    #[test]
    fn a_huge_buffer_is_refused_not_aborted() {
        let store = BufferStore::default();
        let err = store.create(u64::MAX).unwrap_err();
        assert!(err.starts_with("buf_create: cannot allocate"), "{err}");
    }
}
