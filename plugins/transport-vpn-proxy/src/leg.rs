//! A relay's legs: the address it listens on in each network, and that network (address
//! and prefix), against which the targets it forwards to are checked.

use std::net::{IpAddr, SocketAddr};

/// A network as an address and a prefix length, e.g. 10.1.0.0/24.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Network {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let base = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::from(std::net::Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::from(std::net::Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        write!(f, "{base}/{}", self.prefix)
    }
}

/// One leg as asked for: where to listen, and the network when given (`/prefix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegSpec {
    pub listen: SocketAddr,
    pub prefix: Option<u8>,
}

/// Parses `10.1.0.2:9100` or `10.1.0.2:9100/24` (`[fd00::2]:9100/64` for IPv6).
pub fn parse_leg(text: &str) -> Result<LegSpec, String> {
    let (addr, prefix) = match text.rsplit_once('/') {
        Some((addr, p)) => {
            let p: u8 = p
                .parse()
                .map_err(|_| format!("relay leg '{text}': '/{p}' is not a prefix length"))?;
            (addr, Some(p))
        }
        None => (text, None),
    };
    let listen: SocketAddr = addr.parse().map_err(|_| {
        format!("relay leg '{text}': give the leg's IP address and port, e.g. 10.1.0.2:9100 (optionally /24)")
    })?;
    if listen.ip().is_unspecified() {
        return Err(format!(
            "relay leg '{text}': name the relay's address on that network, not {}: targets are checked against each leg's network",
            listen.ip()
        ));
    }
    let max = if listen.is_ipv4() { 32 } else { 128 };
    if prefix.is_some_and(|p| p > max) {
        return Err(format!("relay leg '{text}': a prefix is at most /{max}"));
    }
    Ok(LegSpec { listen, prefix })
}

/// The leg's network: its given prefix, else the prefix of the interface that holds its
/// address (a VPN interface often holds a /32: give the VPN's prefix then, e.g. /10).
pub fn network_of(spec: &LegSpec) -> Result<Network, String> {
    let ip = spec.listen.ip();
    if let Some(prefix) = spec.prefix {
        return Ok(Network { addr: ip, prefix });
    }
    let interfaces = if_addrs::get_if_addrs()
        .map_err(|e| format!("relay leg {}: cannot list the interfaces: {e}", spec.listen))?;
    interfaces
        .iter()
        .find_map(|i| match &i.addr {
            if_addrs::IfAddr::V4(a) if IpAddr::V4(a.ip) == ip => Some(a.prefixlen),
            if_addrs::IfAddr::V6(a) if IpAddr::V6(a.ip) == ip => Some(a.prefixlen),
            _ => None,
        })
        .map(|prefix| Network { addr: ip, prefix })
        .ok_or_else(|| {
            format!(
                "relay leg {}: no interface of this machine has the address {ip}",
                spec.listen
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legs_parse_with_and_without_a_prefix() {
        let l = parse_leg("10.1.0.2:9100/24").unwrap();
        assert_eq!(l.listen, "10.1.0.2:9100".parse().unwrap());
        assert_eq!(l.prefix, Some(24));
        assert_eq!(parse_leg("[fd00::2]:9100").unwrap().prefix, None);
        assert!(parse_leg("0.0.0.0:9100")
            .unwrap_err()
            .contains("not 0.0.0.0"));
        assert!(parse_leg("10.1.0.2:9100/40")
            .unwrap_err()
            .contains("at most /32"));
        assert!(parse_leg("router:9100")
            .unwrap_err()
            .contains("IP address and port"));
        assert!(parse_leg("10.1.0.2:9100/x")
            .unwrap_err()
            .contains("prefix length"));
    }

    #[test]
    fn networks_contain_their_addresses_only() {
        let n = Network {
            addr: "10.1.0.2".parse().unwrap(),
            prefix: 24,
        };
        assert!(n.contains("10.1.0.77".parse().unwrap()));
        assert!(!n.contains("10.1.1.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        assert_eq!(n.to_string(), "10.1.0.0/24");
        let all = Network {
            addr: "10.1.0.2".parse().unwrap(),
            prefix: 0,
        };
        assert!(all.contains("192.168.1.1".parse().unwrap()));
    }

    #[test]
    fn loopback_takes_its_prefix_from_the_interface() {
        let spec = parse_leg("127.0.0.1:0").unwrap();
        assert_eq!(network_of(&spec).unwrap().prefix, 8);
    }
}
