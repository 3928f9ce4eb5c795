//! The two buffers a throughput probe runs a product in: its input row, uploaded once, and
//! its output; freed with the probe.

use abi_stable::std_types::RSlice;
use prima_abi::backend::{BackendBox, Buf};

pub(super) struct ProbeBufs<'b> {
    backend: &'b BackendBox,
    pub x: Buf,
    pub out: Buf,
}

impl<'b> ProbeBufs<'b> {
    /// `x` uploaded, and an output of `out_len` f32s.
    pub fn new(backend: &'b BackendBox, x: &[f32], out_len: usize) -> Result<Self, String> {
        let make = |len: usize| {
            backend
                .buf_create(len as u64)
                .into_result()
                .map(|id| Buf::whole(id, len))
                .map_err(|e| format!("buf_create: {e}"))
        };
        let xb = make(x.len())?;
        let out = match make(out_len) {
            Ok(out) => out,
            Err(e) => {
                backend.buf_drop(xb.id);
                return Err(e);
            }
        };
        // Owned from here: a failed upload frees both.
        let bufs = ProbeBufs {
            backend,
            x: xb,
            out,
        };
        backend
            .upload(bufs.x, RSlice::from_slice(x))
            .into_result()
            .map_err(|e| format!("upload: {e}"))?;
        Ok(bufs)
    }
}

impl Drop for ProbeBufs<'_> {
    fn drop(&mut self) {
        self.backend.buf_drop(self.x.id);
        self.backend.buf_drop(self.out.id);
    }
}
