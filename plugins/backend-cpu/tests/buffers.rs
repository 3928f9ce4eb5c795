//! The CPU backend's activation buffers (ABI v5) through the `Backend` trait: uploads and
//! downloads, the transfer counts, the errors a bad `Buf` gets, and the mixture-of-experts
//! row operations against the ABI's host functions, bit for bit.

use abi_stable::std_types::{RSlice, RSliceMut};
use prima_abi::backend::{
    gather_rows_host, scatter_scaled_host, sum_groups_host, swiglu_oai_host, AttentionParams,
    AttentionSpan, Backend, BackendConfig, Buf, KvSpec, TransferCounts,
};
use prima_abi::on_host::OnHost;
use prima_backend_cpu::CpuBackend;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn backend() -> CpuBackend {
    CpuBackend::new(BackendConfig { threads: 2 }).unwrap()
}

fn random(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
}

/// A buffer holding `data`.
fn buffer(b: &CpuBackend, data: &[f32]) -> Buf {
    let buf = Buf::whole(b.buf_create(data.len() as u64).unwrap(), data.len());
    b.upload(buf, RSlice::from_slice(data)).unwrap();
    buf
}

fn read(b: &CpuBackend, buf: Buf) -> Vec<f32> {
    let mut host = vec![0f32; buf.len()];
    b.download(buf, RSliceMut::from_mut_slice(&mut host))
        .unwrap();
    host
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn upload_and_download_round_trip_through_ranges() {
    let b = backend();
    let id = b.buf_create(10).unwrap();
    let whole = Buf::whole(id, 10);
    assert_eq!(read(&b, whole), vec![0.0; 10], "a new buffer is zeroed");
    b.upload(whole.slice(3, 4), RSlice::from_slice(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    assert_eq!(
        read(&b, whole),
        [0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0]
    );
    assert_eq!(read(&b, whole.slice(4, 2)), [2.0, 3.0]);

    let empty = Buf::whole(b.buf_create(0).unwrap(), 0);
    b.upload(empty, RSlice::from_slice(&[])).unwrap();
    assert!(read(&b, empty).is_empty());
    assert_ne!(empty.id, id, "ids are not reused");
    b.buf_drop(id);
    b.buf_drop(id);
    b.buf_drop(12345);
}

#[test]
fn transfers_count_uploads_and_downloads_and_never_a_wait() {
    let b = backend();
    assert_eq!(b.transfers(), TransferCounts::default());
    let x = buffer(&b, &[1.0; 6]);
    let acc = buffer(&b, &[2.0; 6]);
    let before = b.transfers();
    // Operations on buffers cross nothing.
    b.add(acc, x).unwrap();
    b.scale(acc, 0.5).unwrap();
    assert_eq!(b.transfers().since(before), TransferCounts::default());
    assert_eq!(read(&b, acc.slice(1, 3)), [1.5; 3]);
    assert_eq!(
        b.transfers(),
        TransferCounts {
            uploads: 2,
            downloads: 1,
            waits: 0,
            submissions: 0,
            bytes_up: 48,
            bytes_down: 12,
            param_bytes: 0,
        }
    );
    // A refused transfer moves nothing and is not counted.
    let counts = b.transfers();
    assert!(b.upload(x, RSlice::from_slice(&[1.0; 5])).is_err());
    assert!(b
        .download(Buf::whole(999, 1), RSliceMut::from_mut_slice(&mut [0.0]))
        .is_err());
    assert_eq!(b.transfers(), counts);
}

#[test]
fn bad_buffers_get_errors_that_name_them() {
    let b = backend();
    let x = buffer(&b, &[1.0; 4]);
    let acc = buffer(&b, &[0.0; 4]);
    let err = |r: prima_abi::backend::BackendResult<()>| r.unwrap_err().to_string();

    let unknown = Buf::whole(777, 4);
    assert_eq!(err(b.add(acc, unknown)), "add: unknown buffer 777");
    assert_eq!(err(b.add(unknown, x)), "add: unknown buffer 777");
    assert_eq!(
        err(b.download(unknown, RSliceMut::from_mut_slice(&mut [0.0; 4]))),
        "download: unknown buffer 777"
    );
    assert_eq!(
        err(b.upload(unknown, RSlice::from_slice(&[0.0; 4]))),
        "upload: unknown buffer 777"
    );

    let past = Buf {
        id: x.id,
        offset: 2,
        len: 3,
    };
    assert_eq!(
        err(b.add(acc.head(3), past)),
        format!("add: buffer {}: range 2..+3 exceeds its 4 elements", x.id)
    );
    let overflowing = Buf {
        id: x.id,
        offset: u64::MAX,
        len: 2,
    };
    assert!(err(b.scale(overflowing, 2.0)).contains("exceeds its 4 elements"));

    // The output may not share a buffer with an input, even at another range.
    let shared = buffer(&b, &[1.0; 8]);
    assert_eq!(
        err(b.add(shared.slice(0, 4), shared.slice(4, 4))),
        format!(
            "add: output buffer {} is also an input (4..+4); an in-place operation names it once",
            shared.id
        )
    );
    assert!(err(b.matmul(
        prima_abi::backend::TensorView {
            data: RSlice::from_slice(&[]),
            ggml_type: prima_abi::GgmlType::F32.id(),
            cols: 4,
            rows: 0,
        },
        x,
        1,
        x.head(0)
    ))
    .contains("is also an input"));

    assert_eq!(
        err(b.upload(x, RSlice::from_slice(&[1.0; 3]))),
        format!(
            "upload: host slice of 3 f32s for buffer {}'s range of 4",
            x.id
        )
    );
    // Nothing above changed the buffers.
    assert_eq!(read(&b, x), [1.0; 4]);
    assert_eq!(read(&b, acc), [0.0; 4]);
    assert_eq!(read(&b, shared), [1.0; 8]);
}

#[test]
fn expert_row_operations_match_the_host_functions_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let b = backend();
    let (row_len, n_src) = (37usize, 9usize);
    let src_host = random(&mut rng, row_len * n_src);
    let src = buffer(&b, &src_host);

    // Gather: rows in any order, repeated; from a range that does not start the buffer.
    let rows = [4u32, 0, 8, 4, 2];
    let mut want = vec![0f32; rows.len() * row_len];
    gather_rows_host(&src_host, row_len, &rows, &mut want).unwrap();
    let dst = Buf::whole(b.buf_create(2 * want.len() as u64).unwrap(), 2 * want.len())
        .slice(want.len(), want.len());
    b.gather_rows(src, row_len as u32, RSlice::from_slice(&rows), dst)
        .unwrap();
    assert_eq!(bits(&read(&b, dst)), bits(&want));
    assert!(b
        .gather_rows(
            src,
            row_len as u32,
            RSlice::from_slice(&[9]),
            dst.head(row_len)
        )
        .unwrap_err()
        .contains("row 9 is past the source's 9 rows"));

    // Scatter: in place, the rows not named keep their values.
    let gathered = read(&b, dst);
    let weights = [0.25f32, -1.5, 3.0, 0.1, 7.0];
    let scatter_rows = [6u32, 1, 3, 7, 0];
    let before = random(&mut rng, row_len * n_src);
    let mut want = before.clone();
    scatter_scaled_host(&gathered, row_len, &scatter_rows, &weights, &mut want).unwrap();
    let out = buffer(&b, &before);
    b.scatter_scaled(
        dst,
        row_len as u32,
        RSlice::from_slice(&scatter_rows),
        RSlice::from_slice(&weights),
        out,
    )
    .unwrap();
    assert_eq!(bits(&read(&b, out)), bits(&want));
    for r in [2usize, 4, 5, 8] {
        assert_eq!(
            want[r * row_len..(r + 1) * row_len],
            before[r * row_len..(r + 1) * row_len]
        );
    }

    // Sum of groups: 3 tokens of 3 expert terms each.
    let group = 3usize;
    let mut want = vec![0f32; n_src / group * row_len];
    sum_groups_host(&src_host, row_len, group, &mut want).unwrap();
    let sums = Buf::whole(b.buf_create(want.len() as u64).unwrap(), want.len());
    b.sum_groups(src, row_len as u32, group as u32, sums)
        .unwrap();
    assert_eq!(bits(&read(&b, sums)), bits(&want));
    assert!(b
        .sum_groups(src, row_len as u32, 2, sums)
        .unwrap_err()
        .contains("sum_groups"));

    // gpt-oss's clamped SwiGLU, in place on the gate.
    let (gate_host, up_host) = (random(&mut rng, 300), random(&mut rng, 300));
    let mut want = gate_host.clone();
    swiglu_oai_host(&mut want, &up_host, 1.702, 1.25);
    let (gate, up) = (buffer(&b, &gate_host), buffer(&b, &up_host));
    b.swiglu_oai(gate, up, 1.702, 1.25).unwrap();
    assert_eq!(bits(&read(&b, gate)), bits(&want));
}

#[test]
fn attention_reads_q_k_v_cut_from_one_buffer() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let spec = KvSpec {
        n_layers: 1,
        n_ctx: 16,
        n_head_kv: 2,
        head_dim_k: 8,
        head_dim_v: 8,
    };
    let p = AttentionParams {
        layer: 0,
        n_tokens: 3,
        start_pos: 0,
        n_head: 4,
        n_head_kv: 2,
        head_dim_k: 8,
        head_dim_v: 8,
        scale: 0.35,
        sliding_window: 0,
        softcap: 0.0,
    };
    let (q, k, v) = (
        random(&mut rng, 3 * 32),
        random(&mut rng, 3 * 16),
        random(&mut rng, 3 * 16),
    );
    let span = |kv| AttentionSpan {
        kv,
        n_tokens: 3,
        start_pos: 0,
    };

    let host = backend();
    let kv = host.kv_create(spec).unwrap();
    let mut want = vec![0f32; 3 * 32];
    OnHost(&host)
        .attention_spans(
            RSlice::from_slice(&[span(kv)]),
            RSlice::from_slice(&q),
            RSlice::from_slice(&k),
            RSlice::from_slice(&v),
            p,
            RSliceMut::from_mut_slice(&mut want),
        )
        .unwrap();

    let b = backend();
    let kv = b.kv_create(spec).unwrap();
    let qkv = buffer(&b, &[q.as_slice(), &k, &v].concat());
    let out = Buf::whole(b.buf_create(want.len() as u64).unwrap(), want.len());
    b.attention_spans(
        RSlice::from_slice(&[span(kv)]),
        qkv.slice(0, 96),
        qkv.slice(96, 48),
        qkv.slice(144, 48),
        p,
        out,
    )
    .unwrap();
    assert_eq!(bits(&read(&b, out)), bits(&want));
    assert!(b
        .attention_spans(
            RSlice::from_slice(&[span(kv)]),
            qkv.slice(0, 96),
            qkv.slice(96, 48),
            qkv.slice(144, 48),
            p,
            qkv.head(96),
        )
        .unwrap_err()
        .contains("is also an input"));
}
