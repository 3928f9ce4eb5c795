//! The link router: the emulated home network's latency, in user space.
//!
//! This kernel has no netem, so a process holds one TUN interface per device (each moved
//! into its device's namespace) and routes IPv4 packets between them, holding each in a
//! timestamped queue for the sum of both devices' link latencies. Packets keep their
//! addresses (a node still sees its head's address, which it dials back), every hop of
//! the ring is delayed, and throughput is not capped: packets wait side by side, never
//! one sleep per read. Packets to addresses outside the bed are dropped.
//!
//! Runs as `cargo xtask homelab link-router` (hidden), started by `homelab up`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One device's end of the network: its TUN interface, address and link latency.
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    pub interface: String,
    pub address: Ipv4Addr,
    pub latency: Duration,
}

impl Port {
    /// "phl0=10.87.0.1=3.5" (interface, address, one-way latency in ms).
    pub fn parse(text: &str) -> Result<Port> {
        let parts: Vec<&str> = text.split('=').collect();
        let [interface, address, ms] = parts[..] else {
            bail!("'{text}' is not INTERFACE=ADDRESS=MS");
        };
        let ms: f64 = ms.parse().with_context(|| format!("'{ms}' in '{text}'"))?;
        Ok(Port {
            interface: interface.to_string(),
            address: address
                .parse()
                .with_context(|| format!("'{address}' in '{text}'"))?,
            latency: Duration::from_secs_f64(ms / 1000.0),
        })
    }

    pub fn to_arg(&self) -> String {
        format!(
            "{}={}={}",
            self.interface,
            self.address,
            self.latency.as_secs_f64() * 1000.0
        )
    }
}

/// A packet waiting for its time: due, then arrival order (so a flow keeps its order).
type Queued = Reverse<(Instant, u64, usize, Vec<u8>)>;

/// Creates the TUN interfaces and routes between them until killed.
pub fn run(ports: &[Port]) -> Result<()> {
    let tuns: Vec<Arc<File>> = ports
        .iter()
        .map(|p| open_tun(&p.interface).map(Arc::new))
        .collect::<Result<_>>()?;
    eprintln!("link-router: {} interfaces up", tuns.len());
    let (tx, rx) = mpsc::channel::<(Instant, usize, Vec<u8>)>();
    for (from, tun) in tuns.iter().enumerate() {
        let tun = Arc::clone(tun);
        let tx = tx.clone();
        let ports = ports.to_vec();
        std::thread::spawn(move || read_loop(&tun, from, &ports, &tx));
    }
    drop(tx);
    let mut heap: BinaryHeap<Queued> = BinaryHeap::new();
    let mut seq = 0u64;
    loop {
        let wait = match heap.peek() {
            Some(Reverse((due, ..))) => due.saturating_duration_since(Instant::now()),
            None => Duration::from_secs(3600),
        };
        match rx.recv_timeout(wait) {
            Ok((due, to, packet)) => {
                seq += 1;
                heap.push(Reverse((due, seq, to, packet)));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("every interface is gone"),
        }
        let now = Instant::now();
        while heap.peek().is_some_and(|Reverse((due, ..))| *due <= now) {
            let Reverse((_, _, to, packet)) = heap.pop().expect("peeked");
            // A full queue or a namespace being torn down drops the packet, as a link would.
            let _ = (&*tuns[to]).write(&packet);
        }
    }
}

/// Reads the packets a device sends and queues each for its destination.
fn read_loop(
    tun: &File,
    from: usize,
    ports: &[Port],
    queue: &mpsc::Sender<(Instant, usize, Vec<u8>)>,
) {
    let mut buf = vec![0u8; 65536];
    loop {
        let n = match (&*tun).read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let Some(to) = destination(&buf[..n], ports) else {
            continue;
        };
        let due = Instant::now() + ports[from].latency + ports[to].latency;
        if queue.send((due, to, buf[..n].to_vec())).is_err() {
            return;
        }
    }
}

/// The port an IPv4 packet is addressed to; None for anything else (IPv6, other hosts).
fn destination(packet: &[u8], ports: &[Port]) -> Option<usize> {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return None;
    }
    let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    ports.iter().position(|p| p.address == dst)
}

/// Opens a new TUN interface (IPv4 packets, no extra header) named `name`.
fn open_tun(name: &str) -> Result<File> {
    const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
    let file = File::options()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .context("opening /dev/net/tun (the tun module; needs root)")?;
    // struct ifreq: a 16-byte name, then a union whose first member is the flags.
    let mut ifreq = [0u8; 40];
    if name.len() >= 16 {
        bail!("interface name '{name}' is longer than 15 bytes");
    }
    ifreq[..name.len()].copy_from_slice(name.as_bytes());
    let flags = (libc::IFF_TUN | libc::IFF_NO_PI) as i16;
    ifreq[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes one struct ifreq (40 bytes on Linux), which
    // `ifreq` is, and the descriptor is open for the call's duration.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, ifreq.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("creating TUN interface {name}"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_round_trip_through_their_argument() {
        let port = Port::parse("phl0=10.87.0.1=3.5").unwrap();
        assert_eq!(port.address, Ipv4Addr::new(10, 87, 0, 1));
        assert_eq!(port.latency, Duration::from_micros(3500));
        assert_eq!(Port::parse(&port.to_arg()).unwrap(), port);
        assert!(Port::parse("phl0=10.87.0.1").is_err());
        assert!(Port::parse("phl0=ten=1").is_err());
    }

    #[test]
    fn only_ipv4_packets_to_the_bed_are_routed() {
        let ports = vec![
            Port::parse("a=10.87.0.1=1").unwrap(),
            Port::parse("b=10.87.0.2=1").unwrap(),
        ];
        let mut packet = vec![0u8; 20];
        packet[0] = 0x45;
        packet[16..20].copy_from_slice(&[10, 87, 0, 2]);
        assert_eq!(destination(&packet, &ports), Some(1));
        packet[16..20].copy_from_slice(&[8, 8, 8, 8]);
        assert_eq!(destination(&packet, &ports), None);
        packet[0] = 0x60;
        assert_eq!(destination(&packet, &ports), None);
        assert_eq!(destination(&packet[..10], &ports), None);
    }
}
