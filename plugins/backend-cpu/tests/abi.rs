//! The plugin's ABI wiring: the backend is created through the root module the plugin
//! exports (the same `create` the loader calls) and driven through the `BackendBox` trait
//! object only.

use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{
    AttentionParams, BackendBox, BackendConfig, KvSpec, TensorView, TransferCounts,
};
use prima_abi::on_host::OnHost;
use prima_abi::GgmlType;

fn create(threads: u32) -> BackendBox {
    let root = prima_backend_cpu::__prima_backend_root();
    assert_eq!(root.name()().as_str(), "cpu");
    root.create()(BackendConfig { threads }).unwrap()
}

#[test]
fn exported_create_gives_a_working_backend() {
    assert_eq!(
        prima_backend_cpu::prima_plugin_abi_version(),
        prima_abi::backend::BACKEND_ABI_VERSION
    );
    let b = create(2);
    assert_eq!(b.name().as_str(), "cpu");
    let level = prima_backend_cpu::formats::dispatch::kernel_level_name();
    assert_eq!(
        b.describe().as_str(),
        format!("cpu: {level} kernels, 2 threads")
    );
    assert!(b.supports(GgmlType::Q4K.id()) && !b.supports(GgmlType::Q8K.id()));
    assert!(create(0)
        .describe()
        .as_str()
        .starts_with(&format!("cpu: {level} kernels, ")));

    // Q8_0 weights: 2 rows of 32 columns, d = 0.5, row r holds quants q_i = r + 1.
    let mut w = Vec::new();
    for r in 0..2u8 {
        w.extend_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        w.extend(std::iter::repeat_n(r + 1, 32));
    }
    let view = TensorView {
        data: RSlice::from_slice(&w),
        ggml_type: GgmlType::Q8_0.id(),
        cols: 32,
        rows: 2,
    };
    // 127/128 quantizes exactly to Q8_0 (d = 1/128, q = 127).
    let x = vec![127.0 / 128.0f32; 32];
    let mut out = vec![0f32; 2];
    let before = b.transfers();
    OnHost(&b)
        .matmul(
            view,
            RSlice::from_slice(&x),
            1,
            RSliceMut::from_mut_slice(&mut out),
        )
        .unwrap();
    assert_eq!(out, [15.875, 31.75]);
    // The host-slice call uploads x and downloads out; a host backend never waits.
    assert_eq!(
        b.transfers().since(before),
        TransferCounts {
            uploads: 1,
            downloads: 1,
            bytes_up: 4 * 32,
            bytes_down: 4 * 2,
            ..TransferCounts::default()
        }
    );

    let mut rows = vec![0f32; 32];
    OnHost(&b)
        .get_rows(
            view,
            RSlice::from_slice(&[1]),
            RSliceMut::from_mut_slice(&mut rows),
        )
        .unwrap();
    assert_eq!(rows, vec![1.0; 32]);

    let err = OnHost(&b).matmul(
        view,
        RSlice::from_slice(&x[..31]),
        1,
        RSliceMut::from_mut_slice(&mut out),
    );
    assert_eq!(
        err.unwrap_err().as_str(),
        "matmul: x length (1 tokens × 32 cols) is 31, expected 32"
    );

    let kv = b
        .kv_create(KvSpec {
            n_layers: 1,
            n_ctx: 8,
            n_head_kv: 1,
            head_dim_k: 2,
            head_dim_v: 2,
        })
        .unwrap();
    let p = AttentionParams {
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
    let mut o = [0f32; 2];
    OnHost(&b)
        .attention(
            kv,
            RSlice::from_slice(&[1.0, 0.0]),
            RSlice::from_slice(&[1.0, 1.0]),
            RSlice::from_slice(&[3.0, -2.0]),
            p,
            RSliceMut::from_mut_slice(&mut o),
        )
        .unwrap();
    assert_eq!(o, [3.0, -2.0]);
    b.kv_truncate(kv, 0).unwrap();
    b.kv_drop(kv);
}
