//! Activation-buffer bookkeeping for the GPU backends: the ids the ABI's `buf_create`
//! hands out, the plugin's buffer behind each (its own type), its length, and the range
//! checks every operation makes on a [`Buf`] before it touches the device.

use std::collections::HashMap;

use prima_abi::backend::Buf;

use crate::checks::OpResult;

/// One activation buffer: the plugin's device allocation and its length in f32s.
pub struct Entry<B> {
    pub buf: B,
    pub len: u64,
}

/// The activation buffers a backend holds, by id (ids start at 1 and are never reused).
pub struct Buffers<B> {
    bufs: HashMap<u64, Entry<B>>,
    next: u64,
}

impl<B> Default for Buffers<B> {
    fn default() -> Self {
        Buffers {
            bufs: HashMap::new(),
            next: 1,
        }
    }
}

impl<B> Buffers<B> {
    /// Keeps `buf` (`len` f32s) under a new id.
    pub fn insert(&mut self, buf: B, len: u64) -> u64 {
        let id = self.next;
        self.next += 1;
        self.bufs.insert(id, Entry { buf, len });
        id
    }

    /// Forgets buffer `id`; unknown ids are ignored (as the ABI asks). The device memory
    /// is freed when the plugin's last reference (queued work included) goes.
    pub fn remove(&mut self, id: u64) -> Option<B> {
        self.bufs.remove(&id).map(|e| e.buf)
    }

    /// The buffer behind `b`, after checking that `b` names a live buffer and lies within
    /// it; the error names the operation and the operand.
    pub fn get(&self, op: &str, what: &str, b: Buf) -> OpResult<&B> {
        let e = self
            .bufs
            .get(&b.id)
            .ok_or_else(|| format!("{op}: {what}: unknown buffer {}", b.id))?;
        b.check_within(e.len)
            .map_err(|e| format!("{op}: {what}: {e}"))?;
        Ok(&e.buf)
    }

    /// As [`Self::get`], mutably (a plugin whose launches take `&mut` of the output).
    pub fn get_mut(&mut self, op: &str, what: &str, b: Buf) -> OpResult<&mut B> {
        let e = self
            .bufs
            .get_mut(&b.id)
            .ok_or_else(|| format!("{op}: {what}: unknown buffer {}", b.id))?;
        b.check_within(e.len)
            .map_err(|e| format!("{op}: {what}: {e}"))?;
        Ok(&mut e.buf)
    }

    /// Runs `f` on the buffer behind `out` (checked as [`Self::get`] does), taken out of the
    /// table for the call so that `f` may read the other buffers beside it: a launch that
    /// writes `out` while reading inputs (which [`apart`] keeps in other buffers).
    pub fn with_out<R>(
        &mut self,
        op: &str,
        out: Buf,
        f: impl FnOnce(&mut B, &Self) -> OpResult<R>,
    ) -> OpResult<R> {
        let mut e = self
            .bufs
            .remove(&out.id)
            .ok_or_else(|| format!("{op}: out: unknown buffer {}", out.id))?;
        let r = out
            .check_within(e.len)
            .map_err(|e| format!("{op}: out: {e}"))
            .and_then(|_| f(&mut e.buf, self));
        self.bufs.insert(out.id, e);
        r
    }

    /// Live buffers (tests: nothing leaks).
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }
}

/// Checks that `out` shares no buffer with `inputs` (the ABI's rule: an in-place
/// operation names its buffer once), so a plugin may borrow them apart.
pub fn apart(op: &str, out: Buf, inputs: &[Buf]) -> OpResult<()> {
    if inputs.iter().any(|b| b.id == out.id) {
        return Err(format!(
            "{op}: the output shares buffer {} with an input",
            out.id
        ));
    }
    Ok(())
}

/// `f32` element offset and length of `b` as the `u32`s a kernel takes; the error names
/// the operation.
pub fn offset_u32(op: &str, b: Buf) -> OpResult<u32> {
    u32::try_from(b.offset + b.len)
        .map(|_| b.offset as u32)
        .map_err(|_| {
            format!(
                "{op}: buffer range {}..+{} exceeds 32-bit indices",
                b.offset, b.len
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_and_ids_not_reused() {
        let mut bufs = Buffers::<Vec<f32>>::default();
        let a = bufs.insert(vec![0.0; 8], 8);
        let b = bufs.insert(vec![0.0; 4], 4);
        assert_ne!(a, b);
        assert!(bufs.get("add", "x", Buf::whole(a, 8)).is_ok());
        let e = bufs.get("add", "x", Buf::whole(a, 8).slice(4, 8)).err();
        assert!(e.is_none(), "slice is cut to what the range holds");
        let over = Buf {
            id: b,
            offset: 2,
            len: 3,
        };
        let e = bufs.get("add", "x", over).err().unwrap();
        assert!(e.starts_with("add: x: buffer"), "{e}");
        bufs.remove(a);
        let e = bufs.get("scale", "x", Buf::whole(a, 1)).err().unwrap();
        assert!(e.contains("unknown buffer"), "{e}");
        let sum = bufs
            .with_out("add", Buf::whole(b, 4), |o, rest| {
                assert!(rest.get("add", "x", Buf::whole(b, 4)).is_err());
                o[0] = 1.0;
                Ok(o.len())
            })
            .unwrap();
        assert_eq!(sum, 4);
        assert_eq!(bufs.get("add", "x", Buf::whole(b, 4)).unwrap()[0], 1.0);
        let c = bufs.insert(vec![], 0);
        assert!(c > b);
        assert!(apart("add", Buf::whole(c, 0), &[Buf::whole(c, 0)]).is_err());
    }
}
