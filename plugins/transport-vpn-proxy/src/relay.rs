//! The relay (`prima relay`): a listener on each leg; a client names a target in its
//! preamble, the relay checks that the target is on one of its *other* networks,
//! connects, answers, and then copies bytes both ways without reading them, so the
//! frames stay the TCP transport's end to end.
//!
//! One thread per leg accepts; each forwarded connection has two threads, one per
//! direction, blocked in their reads (an idle ring costs the relay no CPU).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::leg::{network_of, parse_leg, Network};
use crate::preamble;

/// How long a client has to send its request line.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the relay tries to reach a target before answering with the failure.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes moved per read; a one-token frame of any model fits in one.
const COPY_BYTES: usize = 64 << 10;

/// A relay bound on its legs.
pub struct RelayServer {
    legs: Vec<(TcpListener, Network)>,
    stopping: AtomicBool,
}

impl RelayServer {
    /// Binds every leg (`host:port[/prefix]`); at least two, on different networks.
    pub fn bind(specs: &[String]) -> Result<RelayServer, String> {
        if specs.len() < 2 {
            return Err(format!(
                "a relay needs legs on at least two networks, got {}",
                specs.len()
            ));
        }
        let mut legs: Vec<(TcpListener, Network)> = Vec::with_capacity(specs.len());
        for text in specs {
            let spec = parse_leg(text)?;
            let network = network_of(&spec)?;
            if let Some((_, other)) = legs
                .iter()
                .find(|(_, n)| n.contains(network.addr) || network.contains(n.addr))
            {
                return Err(format!(
                    "relay leg {text} is on network {network}, which overlaps another leg's ({other}): each leg must be on a network of its own"
                ));
            }
            let listener = TcpListener::bind(spec.listen)
                .map_err(|e| format!("relay leg {text}: cannot listen on {}: {e}", spec.listen))?;
            legs.push((listener, network));
        }
        Ok(RelayServer {
            legs,
            stopping: AtomicBool::new(false),
        })
    }

    /// Each leg's bound address and network.
    pub fn legs(&self) -> Vec<(SocketAddr, Network)> {
        self.legs
            .iter()
            .filter_map(|(l, n)| l.local_addr().ok().map(|a| (a, *n)))
            .collect()
    }

    /// Accepts on every leg until [`RelayServer::stop`]. Connections already forwarded
    /// run on until one of their ends closes.
    pub fn serve(&self) -> Result<(), String> {
        let networks: Vec<Network> = self.legs.iter().map(|(_, n)| *n).collect();
        std::thread::scope(|scope| {
            for (leg, (listener, _)) in self.legs.iter().enumerate() {
                let networks = networks.clone();
                scope.spawn(move || self.accept_loop(listener, leg, &networks));
            }
        });
        Ok(())
    }

    fn accept_loop(&self, listener: &TcpListener, leg: usize, networks: &[Network]) {
        loop {
            let accepted = listener.accept();
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            match accepted {
                Ok((client, from)) => {
                    let networks = networks.to_vec();
                    let spawned = std::thread::Builder::new()
                        .name("prima-relay-conn".into())
                        .spawn(move || forward(client, from, leg, &networks));
                    if let Err(e) = spawned {
                        eprintln!("relay: {from}: cannot start a thread: {e}");
                    }
                }
                Err(e) => {
                    // Out of descriptors, say: wait a little rather than spin.
                    eprintln!("relay: accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Ends [`RelayServer::serve`].
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for (addr, _) in self.legs() {
            // Wakes the leg's accept; it sees the flag and returns.
            let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
        }
    }
}

/// Which other leg's network holds `target`, resolved; or why the relay will not go there.
pub fn route(target: &str, from_leg: usize, networks: &[Network]) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| format!("target {target}: {e}"))?
        .collect();
    if let Some(ok) = addrs.iter().find(|a| {
        networks
            .iter()
            .enumerate()
            .any(|(j, n)| j != from_leg && n.contains(a.ip()))
    }) {
        return Ok(*ok);
    }
    if addrs.iter().any(|a| networks[from_leg].contains(a.ip())) {
        return Err(format!(
            "target {target} is on the network the request came from ({}); connect to it directly",
            networks[from_leg]
        ));
    }
    let others: Vec<String> = networks
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != from_leg)
        .map(|(_, n)| n.to_string())
        .collect();
    Err(format!(
        "target {target} is on none of this relay's other networks ({})",
        others.join(", ")
    ))
}

/// One client: its request, the route, the connection to the target, then the bytes.
fn forward(client: TcpStream, from: SocketAddr, leg: usize, networks: &[Network]) {
    let _ = client.set_read_timeout(Some(REQUEST_TIMEOUT));
    let target = match preamble::read_line(&client)
        .map_err(|e| format!("the request {e}"))
        .and_then(|line| preamble::parse_request(&line).map(str::to_string))
    {
        Ok(t) => t,
        Err(why) => {
            eprintln!("relay: {from}: refused: {why}");
            refuse(&client, why);
            return;
        }
    };
    let reached = route(&target, leg, networks).and_then(|addr| {
        TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
            .map_err(|e| format!("connecting to {target}: {e}"))
    });
    let server = match reached {
        Ok(s) => s,
        Err(why) => {
            eprintln!("relay: {from} -> {target}: refused: {why}");
            refuse(&client, why);
            return;
        }
    };
    if preamble::answer(&client, &Ok(())).is_err() {
        return;
    }
    // Frames cross in small writes: never hold one back waiting for more.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let _ = client.set_read_timeout(None);
    eprintln!("relay: {from} -> {target}: open");
    let (up, down) = splice(client, server);
    eprintln!("relay: {from} -> {target}: closed ({up} bytes up, {down} bytes down)");
}

/// Answers `ERR why` and closes. What the client sent beyond its request is read first
/// (for a moment, at most 64 KiB): closing over unread bytes resets the connection,
/// which can destroy the answer before the client reads it.
fn refuse(client: &TcpStream, why: String) {
    let _ = preamble::answer(client, &Err(why));
    let _ = client.shutdown(Shutdown::Write);
    let _ = client.set_read_timeout(Some(Duration::from_millis(500)));
    let mut sink = [0u8; 4096];
    let mut left = 64usize << 10;
    let mut r = client;
    while left > 0 {
        match r.read(&mut sink) {
            Ok(n) if n > 0 => left = left.saturating_sub(n),
            _ => break,
        }
    }
}

/// Copies `a → b` and `b → a` until both directions end; the byte counts.
fn splice(a: TcpStream, b: TcpStream) -> (u64, u64) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        let _ = a.shutdown(Shutdown::Both);
        let _ = b.shutdown(Shutdown::Both);
        return (0, 0);
    };
    let up = std::thread::Builder::new()
        .name("prima-relay-up".into())
        .spawn(move || copy_until_end(&a2, &b2));
    let down = copy_until_end(&b, &a);
    let up = match up {
        Ok(h) => h.join().unwrap_or(0),
        Err(_) => {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
            0
        }
    };
    (up, down)
}

/// Copies `from → to` until `from` ends, then passes the end on; on an error both
/// sockets are shut, which ends the other direction too.
fn copy_until_end(from: &TcpStream, to: &TcpStream) -> u64 {
    let mut buf = vec![0u8; COPY_BYTES];
    let mut total = 0u64;
    let (mut r, mut w) = (from, to);
    loop {
        match r.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return total;
            }
            Ok(n) => {
                if w.write_all(&buf[..n]).is_err() {
                    break;
                }
                total += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets() -> Vec<Network> {
        vec![
            Network {
                addr: "10.1.0.2".parse().unwrap(),
                prefix: 24,
            },
            Network {
                addr: "10.2.0.2".parse().unwrap(),
                prefix: 24,
            },
        ]
    }

    #[test]
    fn targets_on_another_leg_are_routed_and_others_refused() {
        assert_eq!(
            route("10.2.0.9:9000", 0, &nets()).unwrap(),
            "10.2.0.9:9000".parse().unwrap()
        );
        let same = route("10.1.0.9:9000", 0, &nets()).unwrap_err();
        assert!(same.contains("the network the request came from"), "{same}");
        let elsewhere = route("8.8.8.8:53", 1, &nets()).unwrap_err();
        assert!(
            elsewhere.contains("none of this relay's other networks (10.1.0.0/24)"),
            "{elsewhere}"
        );
        assert!(route("nonsense", 0, &nets())
            .unwrap_err()
            .contains("nonsense"));
    }

    #[test]
    fn a_relay_needs_two_legs_on_different_networks() {
        let one = RelayServer::bind(&["127.0.0.1:0".into()]).err().unwrap();
        assert!(one.contains("at least two networks"), "{one}");
        let same = RelayServer::bind(&["127.0.0.1:0".into(), "127.0.0.1:0/30".into()])
            .err()
            .unwrap();
        assert!(same.contains("overlaps"), "{same}");
    }
}
