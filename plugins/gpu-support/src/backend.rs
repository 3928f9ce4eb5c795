//! The ABI glue of a GPU plugin: [`GpuBackend`] implements the plugin [`Backend`] trait by
//! locking the plugin's state, calling its [`GpuOps`], and turning errors — and panics,
//! which must never cross the FFI boundary — into `RString`s.

use std::panic::{catch_unwind, AssertUnwindSafe, UnwindSafe};
use std::sync::Mutex;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, ROk, RSlice, RSliceMut, RString};
use prima_abi::backend::{
    AttentionParams, AttentionSpan, Backend, BackendBox, BackendResult, Backend_TO, Buf, KvSpec,
    RopeParams, TensorView, TransferCounts,
};

use crate::checks::OpResult;
use crate::formats;

/// A GPU plugin's state and its operations on device buffers ([`Buf`]), as the ABI's
/// `Backend` has them. An operation queues its work and returns; only `download` waits.
/// Operations the trait leaves out (`swiglu_oai`, `gather_rows`, `scatter_scaled`,
/// `sum_groups`) run through the host by the ABI's defaults, counted.
pub trait GpuOps: Send + 'static {
    /// The backend's name (`cuda`, `wgpu`): `Backend::name` and the errors' wording.
    const NAME: &'static str;

    /// Runs one operation `f`; a plugin that reports errors out of band (wgpu's error
    /// scopes) collects them here.
    fn guarded<T>(&mut self, op: &str, f: impl FnOnce(&mut Self) -> OpResult<T>) -> OpResult<T> {
        let _ = op;
        f(self)
    }

    /// A zeroed buffer of `len` f32s; its id.
    fn buf_create(&mut self, len: usize) -> OpResult<u64>;
    fn buf_drop(&mut self, id: u64);
    /// Host → device, ordered after the operations queued so far.
    fn upload(&mut self, dst: Buf, src: &[f32]) -> OpResult<()>;
    /// Waits for the queued operations; device → host.
    fn download(&mut self, src: Buf, dst: &mut [f32]) -> OpResult<()>;
    fn transfers(&self) -> TransferCounts;

    fn get_rows(&mut self, table: &TensorView<'_>, ids: &[u32], out: Buf) -> OpResult<()>;
    fn matmul(&mut self, w: &TensorView<'_>, x: Buf, n_tokens: usize, out: Buf) -> OpResult<()>;
    fn rms_norm(&mut self, x: Buf, weight: &TensorView<'_>, eps: f32, out: Buf) -> OpResult<()>;
    fn add(&mut self, acc: Buf, x: Buf) -> OpResult<()>;
    fn add_bias(&mut self, x: Buf, bias: &TensorView<'_>) -> OpResult<()>;
    fn scale(&mut self, x: Buf, s: f32) -> OpResult<()>;
    fn rope(
        &mut self,
        x: Buf,
        n_head: usize,
        head_dim: usize,
        positions: &[u32],
        params: &RopeParams<'_>,
    ) -> OpResult<()>;
    fn swiglu(&mut self, gate: Buf, up: Buf) -> OpResult<()>;
    fn geglu(&mut self, gate: Buf, up: Buf) -> OpResult<()>;
    fn kv_create(&mut self, spec: KvSpec) -> OpResult<u64>;
    fn kv_drop(&mut self, kv: u64);
    fn kv_truncate(&mut self, kv: u64, n_pos: u32) -> OpResult<()>;
    /// Every span's keys and values stored, then its attention written (see the ABI's
    /// `attention_spans`); a plugin may loop over the spans.
    fn attention_spans(
        &mut self,
        spans: &[AttentionSpan],
        q: Buf,
        k: Buf,
        v: Buf,
        params: &AttentionParams,
        out: Buf,
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

    fn buf_create(&self, len: u64) -> BackendResult<u64> {
        self.with("buf_create", |s| {
            let len = usize::try_from(len)
                .map_err(|_| format!("buf_create: {len} elements exceed this host's memory"))?;
            s.buf_create(len)
        })
    }

    fn buf_drop(&self, id: u64) {
        let _ = self.with("buf_drop", |s| {
            s.buf_drop(id);
            Ok(())
        });
    }

    fn upload(&self, dst: Buf, src: RSlice<'_, f32>) -> BackendResult<()> {
        self.with("upload", |s| s.upload(dst, src.as_slice()))
    }

    fn download(&self, src: Buf, mut dst: RSliceMut<'_, f32>) -> BackendResult<()> {
        self.with("download", |s| s.download(src, dst.as_mut_slice()))
    }

    fn transfers(&self) -> TransferCounts {
        self.state.lock().map(|s| s.transfers()).unwrap_or_default()
    }

    fn get_rows(&self, table: TensorView<'_>, ids: RSlice<'_, u32>, out: Buf) -> BackendResult<()> {
        self.with("get_rows", |s| s.get_rows(&table, ids.as_slice(), out))
    }

    fn matmul(&self, w: TensorView<'_>, x: Buf, n_tokens: u32, out: Buf) -> BackendResult<()> {
        self.with("matmul", |s| s.matmul(&w, x, n_tokens as usize, out))
    }

    fn rms_norm(&self, x: Buf, weight: TensorView<'_>, eps: f32, out: Buf) -> BackendResult<()> {
        self.with("rms_norm", |s| s.rms_norm(x, &weight, eps, out))
    }

    fn add(&self, acc: Buf, x: Buf) -> BackendResult<()> {
        self.with("add", |s| s.add(acc, x))
    }

    fn add_bias(&self, x: Buf, bias: TensorView<'_>) -> BackendResult<()> {
        self.with("add_bias", |s| s.add_bias(x, &bias))
    }

    fn scale(&self, x: Buf, v: f32) -> BackendResult<()> {
        self.with("scale", |s| s.scale(x, v))
    }

    fn rope(
        &self,
        x: Buf,
        n_head: u32,
        head_dim: u32,
        positions: RSlice<'_, u32>,
        params: RopeParams<'_>,
    ) -> BackendResult<()> {
        self.with("rope", |s| {
            s.rope(
                x,
                n_head as usize,
                head_dim as usize,
                positions.as_slice(),
                &params,
            )
        })
    }

    fn swiglu(&self, gate: Buf, up: Buf) -> BackendResult<()> {
        self.with("swiglu", |s| s.swiglu(gate, up))
    }

    fn geglu(&self, gate: Buf, up: Buf) -> BackendResult<()> {
        self.with("geglu", |s| s.geglu(gate, up))
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

    fn attention_spans(
        &self,
        spans: RSlice<'_, AttentionSpan>,
        q: Buf,
        k: Buf,
        v: Buf,
        params: AttentionParams,
        out: Buf,
    ) -> BackendResult<()> {
        self.with("attention", |s| {
            s.attention_spans(spans.as_slice(), q, k, v, &params, out)
        })
    }

    fn idle(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bufs::Buffers;
    use prima_abi::on_host::OnHost;
    use prima_abi::GgmlType;

    /// A host-memory state whose `add` panics and whose `scale` fails: the glue must turn
    /// both into errors, and report the poisoned lock afterwards rather than panic again.
    #[derive(Default)]
    struct Faulty {
        bufs: Buffers<Vec<f32>>,
        counts: TransferCounts,
    }

    impl GpuOps for Faulty {
        const NAME: &'static str = "faulty";
        fn buf_create(&mut self, len: usize) -> OpResult<u64> {
            Ok(self.bufs.insert(vec![0.0; len], len as u64))
        }
        fn buf_drop(&mut self, id: u64) {
            self.bufs.remove(id);
        }
        fn upload(&mut self, dst: Buf, src: &[f32]) -> OpResult<()> {
            self.counts.uploads += 1;
            let b = self.bufs.get_mut("upload", "dst", dst)?;
            b[dst.offset as usize..][..src.len()].copy_from_slice(src);
            Ok(())
        }
        fn download(&mut self, src: Buf, dst: &mut [f32]) -> OpResult<()> {
            self.counts.downloads += 1;
            let b = self.bufs.get("download", "src", src)?;
            dst.copy_from_slice(&b[src.offset as usize..][..dst.len()]);
            Ok(())
        }
        fn transfers(&self) -> TransferCounts {
            self.counts
        }
        fn get_rows(&mut self, _: &TensorView<'_>, _: &[u32], _: Buf) -> OpResult<()> {
            Ok(())
        }
        fn matmul(&mut self, _: &TensorView<'_>, _: Buf, _: usize, _: Buf) -> OpResult<()> {
            Ok(())
        }
        fn rms_norm(&mut self, _: Buf, _: &TensorView<'_>, _: f32, _: Buf) -> OpResult<()> {
            Ok(())
        }
        fn add(&mut self, _: Buf, _: Buf) -> OpResult<()> {
            panic!("a bug in a kernel wrapper")
        }
        fn add_bias(&mut self, _: Buf, _: &TensorView<'_>) -> OpResult<()> {
            Ok(())
        }
        fn scale(&mut self, _: Buf, _: f32) -> OpResult<()> {
            Err("scale: x is empty".into())
        }
        fn rope(
            &mut self,
            _: Buf,
            _: usize,
            _: usize,
            _: &[u32],
            _: &RopeParams<'_>,
        ) -> OpResult<()> {
            Ok(())
        }
        fn swiglu(&mut self, _: Buf, _: Buf) -> OpResult<()> {
            Ok(())
        }
        fn geglu(&mut self, _: Buf, _: Buf) -> OpResult<()> {
            Ok(())
        }
        fn kv_create(&mut self, _: KvSpec) -> OpResult<u64> {
            Ok(1)
        }
        fn kv_drop(&mut self, _: u64) {}
        fn kv_truncate(&mut self, _: u64, _: u32) -> OpResult<()> {
            Ok(())
        }
        fn attention_spans(
            &mut self,
            _: &[AttentionSpan],
            _: Buf,
            _: Buf,
            _: Buf,
            _: &AttentionParams,
            _: Buf,
        ) -> OpResult<()> {
            Ok(())
        }
    }

    fn faulty() -> BackendBox {
        create(|| Ok(GpuBackend::new(Faulty::default(), "faulty: test".into()))).unwrap()
    }

    #[test]
    fn errors_and_panics_become_errors_that_name_the_backend() {
        let b = faulty();
        assert_eq!(
            (b.name().as_str(), b.describe().as_str()),
            ("faulty", "faulty: test")
        );
        let x = Buf::whole(b.buf_create(4).unwrap(), 4);
        let e = b.scale(x, 2.0).unwrap_err();
        assert_eq!(e.as_str(), "scale: x is empty");
        let e = b.download(Buf::whole(99, 1), RSliceMut::from_mut_slice(&mut [0.0]));
        assert!(e.unwrap_err().contains("unknown buffer 99"));
        let y = Buf::whole(b.buf_create(4).unwrap(), 4);
        let e = b.add(x, y).unwrap_err();
        assert_eq!(e.as_str(), "add: panicked in the faulty backend");
        let e = b.kv_create(KvSpec {
            n_layers: 1,
            n_ctx: 1,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
        });
        assert!(e.unwrap_err().contains("failed earlier (a panic)"));
        assert_eq!(b.transfers(), TransferCounts::default());
        let e = create::<Faulty>(|| panic!("no device")).into_result().err();
        assert_eq!(e.unwrap().as_str(), "creating the faulty backend panicked");
        assert!(b.supports(GgmlType::Q4K as u32) && !b.supports(GgmlType::Q8K as u32));
    }

    /// gpt-oss's two operations through the ABI's default bodies: attention with sinks is
    /// refused, naming the backend; the clamped SwiGLU runs on the host, its moves counted.
    #[test]
    fn sinks_are_refused_by_name_and_the_clamped_swiglu_runs_on_the_host() {
        let b = faulty();
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
        let e = OnHost(&b)
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
        let before = b.transfers();
        let (mut gate, up) = ([9.0f32, -1.0], [8.0f32, 0.5]);
        OnHost(&b)
            .swiglu_oai(
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
        // OnHost: 2 uploads, 1 download; the default body: 2 downloads, 1 upload.
        let moved = b.transfers().since(before);
        assert_eq!((moved.uploads, moved.downloads), (3, 3));
    }
}
