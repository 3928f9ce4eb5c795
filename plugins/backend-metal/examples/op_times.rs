//! Median time per call of a few operations at SmolLM2-135M's shapes, on the adapter the
//! backend picks (software allowed): where a decode step's time goes.
//! `PRIMA_WGPU_ALLOW_SOFTWARE=1 cargo run --release -p prima-backend-metal --example op_times`

use std::time::Instant;

use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{Backend, BackendConfig, TensorView};
use prima_abi::GgmlType;

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..9)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let be = prima_backend_metal::backend::open(BackendConfig { threads: 0 }).unwrap();
    println!("{}", be.describe());
    for (ty, cols, rows, n) in [
        (GgmlType::Q4_1, 576usize, 576usize, 1usize),
        (GgmlType::Q4_1, 576, 1536, 1),
        (GgmlType::Q8_0, 576, 49152, 1),
        (GgmlType::Q4_1, 576, 576, 8),
        (GgmlType::F32, 576, 576, 1),
    ] {
        let data = vec![0x11u8; ty.row_bytes(cols).unwrap() * rows];
        let w = TensorView {
            data: RSlice::from_slice(&data),
            ggml_type: ty as u32,
            cols: cols as u64,
            rows: rows as u64,
        };
        let x = vec![0.5f32; cols * n];
        let mut out = vec![0f32; rows * n];
        let ms = median_ms(|| {
            be.matmul(
                w,
                RSlice::from_slice(&x),
                n as u32,
                RSliceMut::from_mut_slice(&mut out),
            )
            .unwrap();
        });
        println!("matmul {} {cols}x{rows} n={n}: {ms:.2} ms", ty.name());
    }
    let mut a = vec![0.5f32; 576];
    let b = vec![0.25f32; 576];
    let ms = median_ms(|| {
        be.add(RSliceMut::from_mut_slice(&mut a), RSlice::from_slice(&b))
            .unwrap()
    });
    println!("add 576: {ms:.2} ms");
}
