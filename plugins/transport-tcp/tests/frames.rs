//! Frames through the TCP transport over loopback: intact and in order whatever their size
//! (including frames far larger than the socket buffer), kept whole when they arrive in
//! pieces across a receive timeout, never interleaved when two threads send on one
//! connection, and refused with a clear error when over the frame limit.

use abi_stable::std_types::{RSlice, RString};
use prima_abi::transport::{ConnectionBox, Transport, TransportConfig, NO_TIMEOUT};
use prima_transport_tcp::TcpTransport;

const LIMIT: u64 = 64 << 20;

fn pair(max_frame_bytes: u64) -> (ConnectionBox, ConnectionBox, [TcpTransport; 2]) {
    pair_with_limits(max_frame_bytes, max_frame_bytes)
}

/// A connected pair: the client's end (first) and the server's end (second).
fn pair_with_limits(
    client_limit: u64,
    server_limit: u64,
) -> (ConnectionBox, ConnectionBox, [TcpTransport; 2]) {
    let server = TcpTransport::new(TransportConfig {
        max_frame_bytes: server_limit,
    })
    .unwrap();
    let client = TcpTransport::new(TransportConfig {
        max_frame_bytes: client_limit,
    })
    .unwrap();
    let listener = server.listen(RString::from("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr();
    let accepting = std::thread::spawn(move || listener.accept(5_000).unwrap().unwrap());
    let a = client.connect(addr, 5_000).unwrap();
    let b = accepting.join().unwrap();
    (a, b, [server, client])
}

/// A frame whose bytes say which frame it is and where each byte sits in it.
fn frame(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| tag.wrapping_mul(31).wrapping_add((i % 251) as u8))
        .collect()
}

fn recv(conn: &ConnectionBox) -> Vec<u8> {
    conn.recv(10_000)
        .into_result()
        .expect("recv failed")
        .into_option()
        .expect("no frame within 10 s")
        .into_vec()
}

#[test]
fn frames_of_every_size_arrive_intact_and_in_order() {
    let (a, b, _transports) = pair(LIMIT);
    // 0 bytes, a hop's row, and 16 MiB: far more than a loopback socket buffers, so the
    // sender blocks part-way and finishes while the reader drains.
    let sizes = [0usize, 1, 2332, 65_536, 16 << 20, 3, 2332];
    let reader = std::thread::spawn(move || {
        // Let the big frame fill the socket before reading.
        std::thread::sleep(std::time::Duration::from_millis(200));
        sizes.iter().map(|_| recv(&b)).collect::<Vec<_>>()
    });
    for (i, &len) in sizes.iter().enumerate() {
        a.send(RSlice::from_slice(&frame(i as u8, len)))
            .into_result()
            .unwrap();
    }
    let got = reader.join().unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(got[i].len(), len, "frame {i}");
        assert!(got[i] == frame(i as u8, len), "frame {i} corrupted");
    }
}

#[test]
fn big_frames_and_replies_cross_on_one_connection() {
    // Each side sends a frame larger than the socket buffer while the other does the
    // same; a side that blocked its reader while writing would deadlock here.
    let (a, b, _transports) = pair(LIMIT);
    let big = 8 << 20;
    let echo = std::thread::spawn(move || {
        for round in 0..3u8 {
            let sender = std::thread::scope(|s| {
                let h = s.spawn(|| b.send(RSlice::from_slice(&frame(100 + round, big))));
                let got = recv(&b);
                (h.join().unwrap(), got)
            });
            sender.0.into_result().unwrap();
            assert!(sender.1 == frame(round, big), "round {round} corrupted");
        }
    });
    for round in 0..3u8 {
        std::thread::scope(|s| {
            let h = s.spawn(|| a.send(RSlice::from_slice(&frame(round, big))));
            let got = recv(&a);
            h.join().unwrap().into_result().unwrap();
            assert!(got == frame(100 + round, big), "reply {round} corrupted");
        });
    }
    echo.join().unwrap();
}

#[test]
fn two_senders_never_interleave_frames() {
    let (a, b, _transports) = pair(LIMIT);
    let per_thread = 200;
    let len = 100_000;
    std::thread::scope(|s| {
        for t in 0..2u8 {
            let a = &a;
            s.spawn(move || {
                for _ in 0..per_thread {
                    a.send(RSlice::from_slice(&vec![t + 1; len]))
                        .into_result()
                        .unwrap();
                }
            });
        }
        let mut counts = [0usize; 2];
        for _ in 0..2 * per_thread {
            let f = recv(&b);
            assert_eq!(f.len(), len);
            let tag = f[0];
            assert!(f.iter().all(|&x| x == tag), "a frame mixes two senders");
            counts[(tag - 1) as usize] += 1;
        }
        assert_eq!(counts, [per_thread, per_thread]);
    });
}

#[test]
fn frames_over_the_limit_are_refused_by_name() {
    let (a, b, _transports) = pair(4096);
    let err = a
        .send(RSlice::from_slice(&vec![0u8; 5000]))
        .into_result()
        .unwrap_err()
        .into_string();
    assert!(
        err.contains("5000") && err.contains("4096"),
        "the error gives both sizes: {err}"
    );
    // The connection still works after a refused frame: nothing of it was written.
    a.send(RSlice::from_slice(b"after")).into_result().unwrap();
    assert_eq!(recv(&b), b"after");
}

#[test]
fn a_receiver_refuses_a_frame_over_its_own_limit() {
    let (a, b, _transports) = pair_with_limits(LIMIT, 4096);
    a.send(RSlice::from_slice(&vec![0u8; 5000]))
        .into_result()
        .unwrap();
    let err = b.recv(NO_TIMEOUT).into_result().unwrap_err().into_string();
    assert!(err.contains("127.0.0.1"), "the error names the peer: {err}");
}

#[test]
fn a_frame_that_arrives_in_pieces_survives_a_timeout() {
    // A raw peer: it writes the transport's hello, then one frame in three pieces with
    // pauses longer than the receiver's timeout.
    let server = TcpTransport::new(TransportConfig {
        max_frame_bytes: LIMIT,
    })
    .unwrap();
    let listener = server.listen(RString::from("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().into_string();
    let peer = std::thread::spawn(move || {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(b"PRTC\x01\0\0\0").unwrap();
        let payload = frame(9, 5000);
        let mut wire = (payload.len() as u32).to_be_bytes().to_vec();
        wire.extend_from_slice(&payload);
        for piece in [&wire[..2], &wire[2..3000], &wire[3000..]] {
            s.write_all(piece).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
        s
    });
    let conn = listener.accept(5_000).unwrap().unwrap();
    let mut timeouts = 0;
    let got = loop {
        match conn.recv(50).into_result().unwrap().into_option() {
            Some(f) => break f.into_vec(),
            None => timeouts += 1,
        }
        assert!(timeouts < 100, "the frame never completed");
    };
    assert!(
        timeouts >= 2,
        "the receiver timed out between the pieces ({timeouts})"
    );
    assert!(got == frame(9, 5000), "the frame was corrupted");
    drop(peer.join().unwrap());
}
