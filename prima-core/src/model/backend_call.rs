//! The small glue every block uses to call the backend: a backend result as a model error
//! naming the operation, buffers allocated by name, and moves between host and device.
//! Below the forward pass and the blocks it hands rows to (`ffn.rs`, `moe.rs`), so none of
//! them imports another's.

use abi_stable::std_types::{RResult, RSlice, RSliceMut, RString};
use prima_abi::backend::{BackendBox, Buf};

use super::ModelError;

/// Turns a backend result into a model error that names the operation.
pub(super) fn op<T>(result: RResult<T, RString>, name: &'static str) -> Result<T, ModelError> {
    match result {
        RResult::ROk(v) => Ok(v),
        RResult::RErr(message) => Err(ModelError::Backend {
            op: name,
            message: message.into_string(),
        }),
    }
}

/// Allocates a buffer of `len` f32s on `be`, recording its id in `ids` (freed with them).
pub(super) fn alloc(be: &BackendBox, len: usize, ids: &mut Vec<u64>) -> Result<Buf, ModelError> {
    let id = op(be.buf_create(len as u64), "buf_create")?;
    ids.push(id);
    Ok(Buf::whole(id, len))
}

/// Host → device: `src` into `dst` (`src.len()` long from its start).
pub(super) fn upload(be: &BackendBox, dst: Buf, src: &[f32]) -> Result<(), ModelError> {
    op(
        be.upload(dst.head(src.len()), RSlice::from_slice(src)),
        "upload",
    )
}

/// Device → host: `dst.len()` elements from the start of `src`.
pub(super) fn download(be: &BackendBox, src: Buf, dst: &mut [f32]) -> Result<(), ModelError> {
    op(
        be.download(src.head(dst.len()), RSliceMut::from_mut_slice(dst)),
        "download",
    )
}
