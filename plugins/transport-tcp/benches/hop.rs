//! Round trip of one activation frame over loopback through the TCP transport: the cost
//! of two ring hops without any compute. Sizes: one token of SmolLM2 (576 floats), one
//! token of a 70B model (8192 floats), and a 100-token SmolLM2 prompt batch.

use abi_stable::std_types::{RSlice, RString};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prima_abi::transport::{Transport, TransportConfig, NO_TIMEOUT};
use prima_transport_tcp::TcpTransport;

fn round_trip(c: &mut Criterion) {
    let config = TransportConfig {
        max_frame_bytes: 1 << 30,
    };
    let server = TcpTransport::new(config).unwrap();
    let client = TcpTransport::new(config).unwrap();
    let listener = server.listen(RString::from("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr();
    let echo = std::thread::spawn(move || {
        let conn = listener.accept(NO_TIMEOUT).unwrap().unwrap();
        while let Ok(Some(frame)) = conn.recv(NO_TIMEOUT).into_result().map(|f| f.into_option()) {
            if conn.send(RSlice::from_slice(&frame)).is_err() {
                break;
            }
        }
    });
    let conn = client.connect(addr, 5_000).unwrap();
    let mut group = c.benchmark_group("tcp round trip");
    for floats in [576usize, 8192, 57_600] {
        let frame = vec![7u8; 24 + floats * 4];
        group.throughput(Throughput::Bytes(2 * frame.len() as u64));
        group.bench_with_input(BenchmarkId::from_parameter(floats), &frame, |b, frame| {
            b.iter(|| {
                conn.send(RSlice::from_slice(frame)).unwrap();
                conn.recv(NO_TIMEOUT).unwrap().unwrap()
            })
        });
    }
    group.finish();
    conn.close();
    drop(conn);
    let _ = echo.join();
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
