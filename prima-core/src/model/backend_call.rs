//! The small glue every block uses to call the backend: a backend result as a model error
//! naming the operation, and `f32` slices as the ABI's slice types. Below the forward pass
//! and the blocks it hands rows to (`ffn.rs`, `moe.rs`), so none of them imports another's.

use abi_stable::std_types::{RResult, RSlice, RSliceMut, RString};

use super::ModelError;

/// Turns a backend result into a model error that names the operation.
pub(super) fn op(result: RResult<(), RString>, name: &'static str) -> Result<(), ModelError> {
    match result {
        RResult::ROk(()) => Ok(()),
        RResult::RErr(message) => Err(ModelError::Backend {
            op: name,
            message: message.into_string(),
        }),
    }
}

pub(super) fn rs(v: &[f32]) -> RSlice<'_, f32> {
    RSlice::from_slice(v)
}

pub(super) fn rm(v: &mut [f32]) -> RSliceMut<'_, f32> {
    RSliceMut::from_mut_slice(v)
}
