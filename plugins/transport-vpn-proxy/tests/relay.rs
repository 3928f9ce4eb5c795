//! Connections through a relay on loopback: two legs, 127.0.0.1/32 and 127.0.0.2/32,
//! stand for two networks. Frames arrive intact both ways; a target on the client's own
//! network, one on no network of the relay, a dead one, and a request that is not one
//! each get a clear error, never a hang.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

use abi_stable::std_types::{RSlice, RString};
use prima_abi::transport::{relayed, Transport, TransportConfig};
use prima_transport_tcp::TcpTransport;
use prima_transport_vpn_proxy::relay::RelayServer;
use prima_transport_vpn_proxy::VpnProxyTransport;

const CONFIG: TransportConfig = TransportConfig {
    max_frame_bytes: 64 << 20,
};

/// A relay serving on two loopback "networks", and its legs' addresses.
fn relay() -> (Arc<RelayServer>, String, String) {
    let relay =
        Arc::new(RelayServer::bind(&["127.0.0.1:0/32".into(), "127.0.0.2:0/32".into()]).unwrap());
    let legs = relay.legs();
    let serving = relay.clone();
    std::thread::spawn(move || serving.serve());
    (relay, legs[0].0.to_string(), legs[1].0.to_string())
}

fn connect_err(addr: String) -> String {
    let client = VpnProxyTransport::new(CONFIG).unwrap();
    match client.connect(RString::from(addr), 20_000).into_result() {
        Ok(_) => panic!("connected"),
        Err(e) => e.into_string(),
    }
}

#[test]
fn frames_cross_the_relay_intact_both_ways() {
    let (relay, leg_a, _) = relay();
    let server = TcpTransport::new(CONFIG).unwrap();
    let listener = server.listen("127.0.0.2:0".into()).unwrap();
    let target = listener.local_addr().into_string();
    let accepting = std::thread::spawn(move || listener.accept(10_000).unwrap().unwrap());
    let client = VpnProxyTransport::new(CONFIG).unwrap();
    let addr = relayed(&target, &leg_a);
    let a = client.connect(addr.as_str().into(), 10_000).unwrap();
    let b = accepting.join().unwrap();
    assert_eq!(a.peer().as_str(), addr);
    let big: Vec<u8> = (0..(16usize << 20)).map(|i| (i % 251) as u8).collect();
    let (a, b) = (Arc::new(a), Arc::new(b));
    for frame in [vec![], vec![7u8; 2332], big] {
        // Sent from another thread: 16 MiB is more than the sockets on the way buffer.
        let (a2, frame2) = (a.clone(), frame.clone());
        let sending = std::thread::spawn(move || a2.send(RSlice::from_slice(&frame2)).unwrap());
        let got = b.recv(20_000).unwrap().unwrap().into_vec();
        sending.join().unwrap();
        assert!(
            got == frame,
            "a frame of {} bytes changed on the way",
            frame.len()
        );
        let (b2, got2) = (b.clone(), got);
        let sending = std::thread::spawn(move || b2.send(RSlice::from_slice(&got2)).unwrap());
        let back = a.recv(20_000).unwrap().unwrap().into_vec();
        sending.join().unwrap();
        assert!(
            back == frame,
            "a frame of {} bytes changed on the way back",
            frame.len()
        );
    }
    // One end closing reaches the other through the relay.
    a.close();
    assert!(b.recv(20_000).into_result().is_err());
    relay.stop();
}

#[test]
fn a_target_on_the_clients_own_network_is_refused() {
    let (relay, leg_a, _) = relay();
    let err = connect_err(relayed("127.0.0.1:9", &leg_a));
    assert!(
        err.contains("refused") && err.contains("connect to it directly"),
        "{err}"
    );
    relay.stop();
}

#[test]
fn a_target_on_no_network_of_the_relay_is_refused() {
    let (relay, leg_a, _) = relay();
    let err = connect_err(relayed("10.255.0.1:9000", &leg_a));
    assert!(
        err.contains("none of this relay's other networks (127.0.0.2/32)"),
        "{err}"
    );
    relay.stop();
}

#[test]
fn a_dead_target_is_an_error_naming_it() {
    let (relay, leg_a, _) = relay();
    let dead = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let target = dead.local_addr().unwrap().to_string();
    drop(dead);
    let err = connect_err(relayed(&target, &leg_a));
    assert!(
        err.contains(&format!("connecting to {target}")) && err.contains("refused"),
        "{err}"
    );
    relay.stop();
}

#[test]
fn a_request_that_is_not_one_gets_an_error_line() {
    let (relay, leg_a, _) = relay();
    let mut s = TcpStream::connect(&leg_a).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("ERR not a Prima relay request"),
        "{answer}"
    );
    relay.stop();
}

#[test]
fn a_silent_client_is_answered_and_dropped() {
    let (relay, leg_a, _) = relay();
    let mut s = TcpStream::connect(&leg_a).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.contains("no complete line in time"), "{answer}");
    relay.stop();
}

#[test]
fn the_tcp_transport_refuses_relayed_addresses() {
    let tcp = TcpTransport::new(CONFIG).unwrap();
    let err = match tcp
        .connect("10.2.0.1:9000 via 10.1.0.2:9100".into(), 1_000)
        .into_result()
    {
        Ok(_) => panic!("connected"),
        Err(e) => e.into_string(),
    };
    assert!(err.contains("vpn-proxy"), "{err}");
}

#[test]
fn a_dead_relay_is_an_error_naming_it() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let err = connect_err(relayed("127.0.0.2:9000", &relay_addr));
    assert!(
        err.contains(&format!("cannot reach relay {relay_addr}")),
        "{err}"
    );
}
