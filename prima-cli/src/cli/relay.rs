//! `prima relay`: forwards ring connections between networks (two LANs, a LAN and a VPN)
//! that cannot reach each other, from a machine with a leg in each. The relay is the
//! transport plugin's (`vpn-proxy`): it copies bytes without reading the frames.

use prima_core::plugin::load_relay;

#[derive(clap::Args, Debug)]
pub struct RelayArgs {
    /// A leg: this machine's address and port on one network, e.g. 10.1.0.2:9100;
    /// `/prefix` names the network when the interface's own prefix is not it (a VPN
    /// address on a /32 interface: 100.101.1.2:9100/10). Two or more.
    #[arg(long = "listen", required = true)]
    legs: Vec<String>,
    /// Transport plugin that relays.
    #[arg(long, default_value = "vpn-proxy")]
    transport: String,
}

pub fn run(args: RelayArgs) -> anyhow::Result<()> {
    let (relay, path) = load_relay(&args.transport, &args.legs)?;
    for leg in relay.legs() {
        eprintln!("relay: listening on {leg}");
    }
    eprintln!("relay: {} ({})", args.transport, path.display());
    relay
        .serve()
        .into_result()
        .map_err(|e| anyhow::anyhow!("{e}"))
}
