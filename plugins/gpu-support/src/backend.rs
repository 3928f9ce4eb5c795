//! The ABI glue of a GPU plugin: [`GpuBackend`] implements the plugin [`Backend`] trait by
//! locking the plugin's state, calling its [`GpuOps`], and turning errors — and panics,
//! which must never cross the FFI boundary — into `RString`s.

use std::panic::{catch_unwind, AssertUnwindSafe, UnwindSafe};
use std::sync::Mutex;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, ROk, RSlice, RSliceMut, RString};
use prima_abi::backend::{
    AttentionParams, Backend, BackendBox, BackendResult, Backend_TO, KvSpec, RopeParams, TensorView,
};

use crate::checks::OpResult;
use crate::formats;

/// A GPU plugin's state and its operations on host slices, as the ABI's `Backend` has them.
pub trait GpuOps: Send + 'static {
    /// The backend's name (`cuda`, `wgpu`): `Backend::name` and the errors' wording.
    const NAME: &'static str;

    /// Runs one operation `f`; a plugin that reports errors out of band (wgpu's error
    /// scopes) collects them here.
    fn guarded<T>(&mut self, op: &str, f: impl FnOnce(&mut Self) -> OpResult<T>) -> OpResult<T> {
        let _ = op;
        f(self)
    }

    fn get_rows(&mut self, table: &TensorView<'_>, ids: &[u32], out: &mut [f32]) -> OpResult<()>;
    fn matmul(
        &mut self,
        w: &TensorView<'_>,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
    ) -> OpResult<()>;
    fn rms_norm(
        &mut self,
        x: &[f32],
        weight: &TensorView<'_>,
        eps: f32,
        out: &mut [f32],
    ) -> OpResult<()>;
    fn add(&mut self, acc: &mut [f32], x: &[f32]) -> OpResult<()>;
    fn add_bias(&mut self, x: &mut [f32], bias: &TensorView<'_>) -> OpResult<()>;
    fn scale(&mut self, x: &mut [f32], s: f32) -> OpResult<()>;
    fn rope(
        &mut self,
        x: &mut [f32],
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        params: &RopeParams<'_>,
    ) -> OpResult<()>;
    fn swiglu(&mut self, gate: &mut [f32], up: &[f32]) -> OpResult<()>;
    fn geglu(&mut self, gate: &mut [f32], up: &[f32]) -> OpResult<()>;
    fn kv_create(&mut self, spec: KvSpec) -> OpResult<u64>;
    fn kv_drop(&mut self, kv: u64);
    fn kv_truncate(&mut self, kv: u64, n_pos: u32) -> OpResult<()>;
    fn attention(
        &mut self,
        kv: u64,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        params: &AttentionParams,
        out: &mut [f32],
    ) -> OpResult<()>;
}

/// A GPU backend: the plugin's state behind a lock, and the line `describe` gives.
pub struct GpuBackend<S> {
    state: Mutex<S>,
    describe: String,
}

impl<S: GpuOps> GpuBackend<S> {
    pub fn new(state: S, describe: String) -> GpuBackend<S> {
        GpuBackend {
            state: Mutex::new(state),
            describe,
        }
    }

    /// Changes the state outside the ABI (tests choosing kernels); `None` after a panic.
    pub fn with_state<T>(&self, f: impl FnOnce(&mut S) -> T) -> Option<T> {
        self.state.lock().ok().map(|mut s| f(&mut s))
    }

    /// Runs `f` on the locked state; a panic or a poisoned lock becomes an error.
    fn with<T>(&self, op: &str, f: impl FnOnce(&mut S) -> OpResult<T>) -> BackendResult<T> {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut state = self
                .state
                .lock()
                .map_err(|_| format!("{op}: the {} backend failed earlier (a panic)", S::NAME))?;
            state.guarded(op, f)
        }));
        match r {
            Ok(Ok(v)) => ROk(v),
            Ok(Err(e)) => RErr(RString::from(e)),
            Err(_) => RErr(RString::from(format!(
                "{op}: panicked in the {} backend",
                S::NAME
            ))),
        }
    }
}

/// A plugin's `create` export: `open` makes the backend; its errors and panics become
/// errors.
pub fn create<S: GpuOps>(
    open: impl FnOnce() -> Result<GpuBackend<S>, String> + UnwindSafe,
) -> BackendResult<BackendBox> {
    match catch_unwind(open) {
        Ok(Ok(b)) => ROk(Backend_TO::from_value(b, TD_Opaque)),
        Ok(Err(e)) => RErr(RString::from(e)),
        Err(_) => RErr(RString::from(format!(
            "creating the {} backend panicked",
            S::NAME
        ))),
    }
}

impl<S: GpuOps> Backend for GpuBackend<S> {
    fn name(&self) -> RString {
        RString::from(S::NAME)
    }

    fn describe(&self) -> RString {
        RString::from(self.describe.as_str())
    }

    fn supports(&self, ggml_type: u32) -> bool {
        formats::format_of(ggml_type).is_some()
    }

    fn get_rows(
        &self,
        table: TensorView<'_>,
        ids: RSlice<'_, u32>,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.with("get_rows", |s| {
            s.get_rows(&table, ids.as_slice(), out.as_mut_slice())
        })
    }

    fn matmul(
        &self,
        w: TensorView<'_>,
        x: RSlice<'_, f32>,
        n_tokens: u32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.with("matmul", |s| {
            s.matmul(&w, x.as_slice(), n_tokens as usize, out.as_mut_slice())
        })
    }

    fn rms_norm(
        &self,
        x: RSlice<'_, f32>,
        weight: TensorView<'_>,
        eps: f32,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.with("rms_norm", |s| {
            s.rms_norm(x.as_slice(), &weight, eps, out.as_mut_slice())
        })
    }

    fn add(&self, mut acc: RSliceMut<'_, f32>, x: RSlice<'_, f32>) -> BackendResult<()> {
        self.with("add", |s| s.add(acc.as_mut_slice(), x.as_slice()))
    }

    fn add_bias(&self, mut x: RSliceMut<'_, f32>, bias: TensorView<'_>) -> BackendResult<()> {
        self.with("add_bias", |s| s.add_bias(x.as_mut_slice(), &bias))
    }

    fn scale(&self, mut x: RSliceMut<'_, f32>, v: f32) -> BackendResult<()> {
        self.with("scale", |s| s.scale(x.as_mut_slice(), v))
    }

    fn rope(
        &self,
        mut x: RSliceMut<'_, f32>,
        n_head: u32,
        head_dim: u32,
        positions: RSlice<'_, u32>,
        params: RopeParams<'_>,
    ) -> BackendResult<()> {
        self.with("rope", |s| {
            s.rope(
                x.as_mut_slice(),
                n_head as usize,
                head_dim as usize,
                positions.as_slice(),
                &params,
            )
        })
    }

    fn swiglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.with("swiglu", |s| s.swiglu(gate.as_mut_slice(), up.as_slice()))
    }

    fn geglu(&self, mut gate: RSliceMut<'_, f32>, up: RSlice<'_, f32>) -> BackendResult<()> {
        self.with("geglu", |s| s.geglu(gate.as_mut_slice(), up.as_slice()))
    }

    fn kv_create(&self, spec: KvSpec) -> BackendResult<u64> {
        self.with("kv_create", |s| s.kv_create(spec))
    }

    fn kv_drop(&self, kv: u64) {
        let _ = self.with("kv_drop", |s| {
            s.kv_drop(kv);
            Ok(())
        });
    }

    fn kv_truncate(&self, kv: u64, n_pos: u32) -> BackendResult<()> {
        self.with("kv_truncate", |s| s.kv_truncate(kv, n_pos))
    }

    fn attention(
        &self,
        kv: u64,
        q: RSlice<'_, f32>,
        k: RSlice<'_, f32>,
        v: RSlice<'_, f32>,
        params: AttentionParams,
        mut out: RSliceMut<'_, f32>,
    ) -> BackendResult<()> {
        self.with("attention", |s| {
            s.attention(
                kv,
                q.as_slice(),
                k.as_slice(),
                v.as_slice(),
                &params,
                out.as_mut_slice(),
            )
        })
    }

    fn idle(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use prima_abi::GgmlType;

    /// A state whose `add` panics and whose `scale` fails: the glue must turn both into
    /// errors, and report the poisoned lock afterwards rather than panic again.
    struct Faulty;

    impl GpuOps for Faulty {
        const NAME: &'static str = "faulty";
        fn get_rows(&mut self, _: &TensorView<'_>, _: &[u32], _: &mut [f32]) -> OpResult<()> {
            Ok(())
        }
        fn matmul(
            &mut self,
            _: &TensorView<'_>,
            _: &[f32],
            _: usize,
            _: &mut [f32],
        ) -> OpResult<()> {
            Ok(())
        }
        fn rms_norm(
            &mut self,
            _: &[f32],
            _: &TensorView<'_>,
            _: f32,
            _: &mut [f32],
        ) -> OpResult<()> {
            Ok(())
        }
        fn add(&mut self, _: &mut [f32], _: &[f32]) -> OpResult<()> {
            panic!("a bug in a kernel wrapper")
        }
        fn add_bias(&mut self, _: &mut [f32], _: &TensorView<'_>) -> OpResult<()> {
            Ok(())
        }
        fn scale(&mut self, _: &mut [f32], _: f32) -> OpResult<()> {
            Err("scale: x is empty".into())
        }
        fn rope(
            &mut self,
            _: &mut [f32],
            _: usize,
            _: usize,
            _: &[u32],
            _: &RopeParams<'_>,
        ) -> OpResult<()> {
            Ok(())
        }
        fn swiglu(&mut self, _: &mut [f32], _: &[f32]) -> OpResult<()> {
            Ok(())
        }
        fn geglu(&mut self, _: &mut [f32], _: &[f32]) -> OpResult<()> {
            Ok(())
        }
        fn kv_create(&mut self, _: KvSpec) -> OpResult<u64> {
            Ok(1)
        }
        fn kv_drop(&mut self, _: u64) {}
        fn kv_truncate(&mut self, _: u64, _: u32) -> OpResult<()> {
            Ok(())
        }
        fn attention(
            &mut self,
            _: u64,
            _: &[f32],
            _: &[f32],
            _: &[f32],
            _: &AttentionParams,
            _: &mut [f32],
        ) -> OpResult<()> {
            Ok(())
        }
    }

    #[test]
    fn errors_and_panics_become_errors_that_name_the_backend() {
        let b = create(|| Ok(GpuBackend::new(Faulty, "faulty: test".into()))).unwrap();
        assert_eq!(
            (b.name().as_str(), b.describe().as_str()),
            ("faulty", "faulty: test")
        );
        let mut x = [1.0f32; 4];
        let e = b.scale(RSliceMut::from_mut_slice(&mut x), 2.0).unwrap_err();
        assert_eq!(e.as_str(), "scale: x is empty");
        let e = b
            .add(
                RSliceMut::from_mut_slice(&mut x),
                RSlice::from_slice(&[0.0; 4]),
            )
            .unwrap_err();
        assert_eq!(e.as_str(), "add: panicked in the faulty backend");
        let e = b.kv_create(KvSpec {
            n_layers: 1,
            n_ctx: 1,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
        });
        assert!(e.unwrap_err().contains("failed earlier (a panic)"));
        let e = create::<Faulty>(|| panic!("no device")).into_result().err();
        assert_eq!(e.unwrap().as_str(), "creating the faulty backend panicked");
        assert!(b.supports(GgmlType::Q4K as u32) && !b.supports(GgmlType::Q8K as u32));
    }

    /// gpt-oss's two operations through the ABI's default bodies: attention with sinks is
    /// refused, naming the backend; the clamped SwiGLU runs on the host.
    #[test]
    fn sinks_are_refused_by_name_and_the_clamped_swiglu_runs_on_the_host() {
        let b = create(|| Ok(GpuBackend::new(Faulty, "faulty: test".into()))).unwrap();
        let params = AttentionParams {
            layer: 0,
            n_tokens: 1,
            start_pos: 0,
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
            scale: 1.0,
            sliding_window: 0,
            softcap: 0.0,
        };
        let (q, mut out) = ([0.5f32; 2], [0f32; 2]);
        let e = b
            .attention_spans_sinks(
                RSlice::from_slice(&[]),
                RSlice::from_slice(&q),
                RSlice::from_slice(&q),
                RSlice::from_slice(&q),
                RSlice::from_slice(&[1.0]),
                params,
                RSliceMut::from_mut_slice(&mut out),
            )
            .unwrap_err();
        assert!(
            e.contains("attention with sinks") && e.contains("faulty backend"),
            "{e}"
        );
        let (mut gate, up) = ([9.0f32, -1.0], [8.0f32, 0.5]);
        b.swiglu_oai(
            RSliceMut::from_mut_slice(&mut gate),
            RSlice::from_slice(&up),
            1.702,
            7.0,
        )
        .unwrap();
        // The gate clamped to 7, the up to 7 (then + 1).
        let want0 = 7.0 / (1.0 + (-1.702f32 * 7.0).exp()) * 8.0;
        assert_eq!(gate[0], want0);
        assert!((gate[1] - (-1.0 / (1.0 + 1.702f32.exp()) * 1.5)).abs() < 1e-6);
    }
}
