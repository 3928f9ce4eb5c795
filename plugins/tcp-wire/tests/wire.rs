//! The bytes on the wire (what tokio-util's `LengthDelimitedCodec` wrote, so old and new
//! peers talk) and the timeouts of accepting, checked with a raw socket as the other side.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use abi_stable::std_types::{RSlice, RString};
use prima_abi::transport::{Transport, TransportConfig};
use prima_tcp_wire::TcpTransport;

fn transport() -> TcpTransport {
    TcpTransport::new(TransportConfig {
        max_frame_bytes: 4096,
    })
    .unwrap()
}

#[test]
fn a_frame_is_a_big_endian_length_then_the_payload() {
    let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap().to_string();
    let conn = transport().connect(RString::from(addr), 5_000).unwrap();
    let (mut peer, _) = raw.accept().unwrap();
    conn.send(RSlice::from_slice(b"abc")).unwrap();
    let mut got = [0u8; 15];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got[..8], b"PRTC\x01\0\0\0", "the hello");
    assert_eq!(&got[8..], b"\0\0\0\x03abc", "the frame");
    // And a frame written that way by hand arrives whole.
    peer.write_all(b"\0\0\0\x02hi").unwrap();
    let frame = conn.recv(5_000).unwrap().unwrap();
    assert_eq!(frame.as_slice(), b"hi");
}

#[test]
fn accept_gives_up_at_its_deadline() {
    let listener = transport().listen(RString::from("127.0.0.1:0")).unwrap();
    let start = Instant::now();
    assert!(listener.accept(100).unwrap().is_none());
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(100), "waited {waited:?}");
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
}

#[test]
fn a_peer_without_the_hello_is_refused_by_address() {
    let listener = transport().listen(RString::from("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().to_string();
    let mut stray = std::net::TcpStream::connect(addr).unwrap();
    stray.write_all(b"GET / HTTP/1.1\r\n").unwrap();
    let err = listener
        .accept(5_000)
        .into_result()
        .err()
        .expect("an error")
        .into_string();
    assert!(
        err.contains("127.0.0.1") && err.contains("bad hello"),
        "{err}"
    );
}

#[test]
fn connecting_to_a_closed_port_names_the_address() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let err = transport()
        .connect(RString::from(addr.as_str()), 2_000)
        .into_result()
        .err()
        .expect("an error")
        .into_string();
    assert!(err.contains(&addr), "{err}");
}
