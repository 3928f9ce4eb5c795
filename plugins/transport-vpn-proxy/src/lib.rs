//! Prima's transport across networks (`vpn-proxy`). A plain `host:port` — on the LAN, or
//! a WireGuard/Tailscale address, which is just an address on another network the
//! machine has an interface in — is reached as the TCP transport reaches it. A relayed
//! address, `TARGET via RELAY`, is reached through a relay (`prima relay`, [`relay`])
//! with a leg in both networks: the client sends the relay a one-line request naming
//! the target ([`preamble`]), the relay checks and connects, and from its `OK` on the
//! connection is the TCP transport's — the same hello, frames and blocking data path
//! (`prima_tcp_wire::connect_over`), carried through the relay unread.
//!
//! Listening is plain TCP: a relayed connection arrives at a node as any other.

pub mod leg;
pub mod preamble;
pub mod relay;

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, ROk, RString, RVec};
use prima_abi::transport::{
    split_via, ConnectionBox, ListenerBox, Relay, RelayBox, Relay_TO, Transport, TransportBox,
    TransportConfig, TransportResult, Transport_TO, NO_TIMEOUT, VIA,
};
use prima_tcp_wire::{connect_over, TcpTransport};

use relay::RelayServer;

prima_abi::export_transport_plugin!(
    name = "vpn-proxy",
    create = create_transport,
    relay = start_relay
);

extern "C" fn create_transport(config: TransportConfig) -> TransportResult<TransportBox> {
    match VpnProxyTransport::new(config) {
        Ok(t) => ROk(Transport_TO::from_value(t, TD_Opaque)),
        Err(e) => RErr(RString::from(e)),
    }
}

extern "C" fn start_relay(legs: RVec<RString>) -> TransportResult<RelayBox> {
    let legs: Vec<String> = legs.into_iter().map(RString::into_string).collect();
    match RelayServer::bind(&legs) {
        Ok(r) => ROk(Relay_TO::from_value(r, TD_Opaque)),
        Err(e) => RErr(e.into()),
    }
}

impl Relay for RelayServer {
    fn legs(&self) -> RVec<RString> {
        RelayServer::legs(self)
            .into_iter()
            .map(|(addr, net)| RString::from(format!("{addr} ({net})")))
            .collect()
    }

    fn serve(&self) -> TransportResult<()> {
        match RelayServer::serve(self) {
            Ok(()) => ROk(()),
            Err(e) => RErr(e.into()),
        }
    }

    fn stop(&self) {
        RelayServer::stop(self)
    }
}

/// Plain addresses through the TCP transport, relayed ones through their relay.
pub struct VpnProxyTransport {
    tcp: TcpTransport,
}

impl VpnProxyTransport {
    pub fn new(config: TransportConfig) -> Result<VpnProxyTransport, String> {
        Ok(VpnProxyTransport {
            tcp: TcpTransport::new(config)?,
        })
    }

    /// Reaches `target` through the relay leg at `relay`, within `timeout_ms`.
    fn through_relay(
        &self,
        addr: &str,
        target: &str,
        relay: &str,
        timeout_ms: u64,
    ) -> Result<ConnectionBox, String> {
        let fail = |why: String| format!("connecting to {addr}: {why}");
        if relay.contains(VIA) {
            return Err(fail(
                "one relay per address (a relay does not chain)".into(),
            ));
        }
        let deadline = (timeout_ms != NO_TIMEOUT)
            .then(|| Instant::now() + Duration::from_millis(timeout_ms.max(1)));
        let left = || -> Result<Option<Duration>, String> {
            match deadline {
                None => Ok(None),
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Ok(Some(left)),
                    _ => Err(fail(format!(
                        "relay {relay}: no answer within {timeout_ms} ms"
                    ))),
                },
            }
        };
        let relay_addr = relay
            .to_socket_addrs()
            .map_err(|e| fail(format!("relay {relay}: {e}")))?
            .next()
            .ok_or_else(|| fail(format!("relay {relay}: no address")))?;
        let stream = match left()? {
            Some(t) => TcpStream::connect_timeout(&relay_addr, t),
            None => TcpStream::connect(relay_addr),
        }
        .map_err(|e| fail(format!("cannot reach relay {relay}: {e}")))?;
        let _ = stream.set_nodelay(true);
        use std::io::Write;
        (&stream)
            .write_all(preamble::request(target).as_bytes())
            .map_err(|e| fail(format!("relay {relay}: {e}")))?;
        stream
            .set_read_timeout(left()?)
            .map_err(|e| fail(e.to_string()))?;
        let answer =
            preamble::read_line(&stream).map_err(|e| fail(format!("relay {relay} {e}")))?;
        preamble::parse_answer(&answer)
            .map_err(|why| fail(format!("relay {relay} refused: {why}")))?;
        stream
            .set_read_timeout(None)
            .map_err(|e| fail(e.to_string()))?;
        connect_over(stream, addr.to_string(), self.tcp.max_frame())
    }
}

impl Transport for VpnProxyTransport {
    fn name(&self) -> RString {
        "vpn-proxy".into()
    }

    fn listen(&self, addr: RString) -> TransportResult<ListenerBox> {
        if addr.contains(VIA) {
            return RErr(format!("cannot listen on {addr}: listen on this device's own address (relays forward to it)").into());
        }
        self.tcp.listen(addr)
    }

    fn connect(&self, addr: RString, timeout_ms: u64) -> TransportResult<ConnectionBox> {
        match split_via(&addr) {
            (target, None) => self.tcp.connect(target.into(), timeout_ms),
            (target, Some(relay)) => match self.through_relay(&addr, target, relay, timeout_ms) {
                Ok(c) => ROk(c),
                Err(e) => RErr(e.into()),
            },
        }
    }
}
