//! Time per call of a few operations at SmolLM2-135M's shapes, on the adapter the backend
//! picks (software allowed): where a decode step's time goes. Each operation is recorded
//! `REPS` times on device buffers and waited for once, as a decode step does.
//! `PRIMA_WGPU_ALLOW_SOFTWARE=1 cargo run --release -p prima-backend-metal --example op_times`

use std::time::Instant;

use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{Backend, BackendConfig, Buf, TensorView};
use prima_abi::GgmlType;

const REPS: usize = 30;

/// Median over 5 runs of (`f` recorded `REPS` times, then a download), per call.
fn per_call_ms(be: &impl Backend, sync: Buf, mut f: impl FnMut()) -> f64 {
    let mut host = vec![0f32; sync.len()];
    let mut t: Vec<f64> = (0..6)
        .map(|_| {
            let s = Instant::now();
            for _ in 0..REPS {
                f();
            }
            be.download(sync, RSliceMut::from_mut_slice(&mut host))
                .unwrap();
            s.elapsed().as_secs_f64() * 1e3 / REPS as f64
        })
        .collect();
    t.remove(0);
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let be = prima_backend_metal::backend::open(BackendConfig { threads: 0 }).unwrap();
    println!("{}", be.describe());
    let buf = |len: usize| Buf::whole(be.buf_create(len as u64).unwrap(), len);
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
        let (x, out) = (buf(cols * n), buf(rows * n));
        be.upload(x, RSlice::from_slice(&vec![0.5f32; cols * n]))
            .unwrap();
        let ms = per_call_ms(&be, out.head(1), || {
            be.matmul(w, x, n as u32, out).unwrap();
        });
        println!("matmul {} {cols}x{rows} n={n}: {ms:.3} ms", ty.name());
    }
    let (a, b) = (buf(576), buf(576));
    let ms = per_call_ms(&be, a.head(1), || be.add(a, b).unwrap());
    println!("add 576: {ms:.3} ms");
    let t = be.transfers();
    println!("transfers: {t:?}");
}
