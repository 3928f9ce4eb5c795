//! Authenticated, encrypted links: every connection of the ring (control and data) is a
//! [`Link`], a transport connection with the Noise protocol on top.
//!
//! Why here, over the transport's frames, and not in a transport plugin: it then works
//! unchanged over every transport, and end to end through a relay (which only copies
//! ciphertext), with no change to the transport ABI.
//!
//! Handshake: `Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s` with the cluster key as the
//! pre-shared key. Both sides make fresh ephemeral keys for each link (forward secrecy);
//! only a device holding the cluster key can complete it, so a peer without it is refused
//! before a single ring message (let alone weights or activations) is read. The opening
//! frame also says whether the connecting side wants a plain link (`--insecure`); the
//! other side accepts that only when it runs `--insecure` too, and otherwise answers a
//! plain [`Control::Refused`] naming why, so both sides can say what went wrong.
//!
//! Replay protection: each direction of a link numbers its Noise messages 0, 1, 2, … and
//! that number is the ChaCha20-Poly1305 nonce. Nothing on the wire carries it: the
//! receiver expects the next number, so a replayed, reordered, dropped or altered frame
//! fails to authenticate, and the link is closed. A replay across links fails too: each
//! link has its own ephemeral keys.
//!
//! Framing: a ring frame is sealed as `len (u64 LE) ‖ frame`, cut into pieces of at most
//! 65,519 bytes (Noise's 65,535-byte message less its 16-byte tag), and the sealed pieces
//! are sent as one transport frame; the length makes a frame cut at a piece boundary
//! fail. Sealing and opening reuse per-direction buffers: the per-token path allocates
//! nothing more than a plain link does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use abi_stable::std_types::{RResult, RSlice, RString};
use snow::{HandshakeState, StatelessTransportState};

use prima_abi::transport::{ConnectionBox, ListenerBox, TransportBox, NO_TIMEOUT};

use super::key::LinkSecurity;
use super::protocol::{decode, encode_control, Control, Frame};
use super::RingError;

/// The Noise protocol of every link.
pub const NOISE_PARAMS: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Bound into the handshake: a peer speaking another version of this framing fails it.
const PROLOGUE: &[u8] = b"prima ring link v1";
/// Starts the opening frame and its answer; a plain ring frame starts with `C` or `A`.
const MAGIC: &[u8] = b"PRIMA-LINK1";
const MODE_NOISE: u8 = b'N';
const MODE_PLAIN: u8 = b'P';
const TAG: usize = 16;
/// Noise's largest message.
const MAX_SEALED: usize = 65_535;
const MAX_PIECE: usize = MAX_SEALED - TAG;
const LEN_PREFIX: usize = 8;

/// How long an accepted peer has to open the handshake.
const HANDSHAKE_TIMEOUT_MS: u64 = 5_000;
/// How often the accepting thread looks whether its listener was dropped.
const ACCEPT_POLL_MS: u64 = 500;

/// A listener whose connections run the responder's handshake as soon as they arrive, on
/// a thread of its own, like a kernel completing TCP handshakes in its backlog: a peer's
/// [`Link::connect`] then never waits for this device to reach its next `accept` (ring
/// setup connects devices to each other in an order that would otherwise deadlock).
/// Handshakes run one after another, so links come out in the order their handshakes
/// finished for the peers: a head's control link, answered before the head sends any
/// setup, always comes out before the data link its setup makes the previous device open.
/// Refused peers are logged with the listener's `who` ("node", "head") and the reason.
pub struct LinkListener {
    local_addr: String,
    ready: Mutex<mpsc::Receiver<Link>>,
    stop: Arc<AtomicBool>,
}

impl LinkListener {
    pub fn start(
        listener: ListenerBox,
        security: LinkSecurity,
        who: &'static str,
    ) -> Result<LinkListener, RingError> {
        let local_addr = listener.local_addr().into_string();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("prima-link-accept".into())
            .spawn(move || accept_loop(&listener, &security, who, &tx, &stopped))
            .map_err(|e| RingError::Setup(format!("cannot start the accepting thread: {e}")))?;
        Ok(LinkListener {
            local_addr,
            ready: Mutex::new(rx),
            stop,
        })
    }

    pub fn local_addr(&self) -> &str {
        &self.local_addr
    }

    /// The next peer that completed the handshake; `None` after `timeout_ms`.
    pub fn accept(&self, timeout_ms: u64) -> Option<Link> {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        if timeout_ms == NO_TIMEOUT {
            ready.recv().ok()
        } else {
            ready.recv_timeout(Duration::from_millis(timeout_ms)).ok()
        }
    }
}

impl Drop for LinkListener {
    /// The accepting thread stops within [`ACCEPT_POLL_MS`] and closes the listener.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn accept_loop(
    listener: &ListenerBox,
    security: &LinkSecurity,
    who: &'static str,
    ready: &mpsc::Sender<Link>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept(ACCEPT_POLL_MS).into_result() {
            Ok(conn) => {
                let Some(conn) = conn.into_option() else {
                    continue;
                };
                match Link::accept(conn, HANDSHAKE_TIMEOUT_MS, security) {
                    // Nobody waits any more when the listener was dropped.
                    Ok(link) => drop(ready.send(link)),
                    Err(e) => eprintln!("{who}: {e}"),
                }
            }
            // A stray client or a bad transport hello: the transport says why.
            Err(e) => {
                tracing::warn!("refused a connection: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A connection of the ring: sends and receives whole frames, sealed when the cluster has
/// a key. Safe to share between threads: one may close it while another is blocked in a
/// send or receive.
pub struct Link {
    conn: ConnectionBox,
    cipher: Option<Cipher>,
}

struct Cipher {
    noise: StatelessTransportState,
    /// Sending side: the next nonce, and the buffers a frame is sealed in.
    seal: Mutex<Sealer>,
    /// Receiving side: the next expected nonce; `None` once a frame failed to open (the
    /// link is then dead: its nonces can no longer agree).
    open: Mutex<Opener>,
}

#[derive(Default)]
struct Sealer {
    nonce: u64,
    plain: Vec<u8>,
    sealed: Vec<u8>,
}

struct Opener {
    nonce: Option<u64>,
    piece: Vec<u8>,
}

impl Link {
    /// Connects to `addr` and runs the link handshake. A peer that refuses (another key,
    /// or a plain link where it wants a sealed one) is an error saying why.
    pub fn connect(
        transport: &TransportBox,
        addr: &str,
        timeout_ms: u64,
        security: &LinkSecurity,
    ) -> Result<Link, RingError> {
        let conn = transport
            .connect(addr.into(), timeout_ms)
            .into_result()
            .map_err(|e| RingError::Transport(e.into_string()))?;
        Link::open(conn, addr, timeout_ms, security)
    }

    /// Runs the connecting side of the handshake on `conn`, a connection to `addr`.
    pub fn open(
        conn: ConnectionBox,
        addr: &str,
        timeout_ms: u64,
        security: &LinkSecurity,
    ) -> Result<Link, RingError> {
        let result = initiate(&conn, addr, timeout_ms, security);
        if result.is_err() {
            conn.close();
        }
        result.map(|cipher| Link { conn, cipher })
    }

    /// Runs the responder's side of the handshake on a connection just accepted. A peer
    /// that cannot be admitted is told why (a plain [`Control::Refused`]), the connection
    /// is closed, and the error says why too, for this device's log.
    pub fn accept(
        conn: ConnectionBox,
        timeout_ms: u64,
        security: &LinkSecurity,
    ) -> Result<Link, RingError> {
        match respond(&conn, timeout_ms, security) {
            Ok(cipher) => Ok(Link { conn, cipher }),
            Err(reason) => {
                let _ = raw_send(
                    &conn,
                    &encode_control(&Control::Refused {
                        reason: reason.clone(),
                    }),
                );
                let peer = conn.peer().into_string();
                conn.close();
                Err(RingError::Link {
                    peer,
                    reason: format!("refused: {reason}"),
                })
            }
        }
    }

    /// Whether frames on this link are sealed.
    pub fn is_sealed(&self) -> bool {
        self.cipher.is_some()
    }

    pub fn peer(&self) -> RString {
        self.conn.peer()
    }

    /// Ends any send or receive in progress on this link, from any thread.
    pub fn close(&self) {
        self.conn.close()
    }

    pub fn send(&self, frame: &[u8]) -> Result<(), RingError> {
        let Some(cipher) = &self.cipher else {
            return raw_send(&self.conn, frame);
        };
        let mut seal = cipher.seal.lock().unwrap_or_else(|e| e.into_inner());
        let Sealer {
            nonce,
            plain,
            sealed,
        } = &mut *seal;
        plain.clear();
        plain.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        plain.extend_from_slice(frame);
        sealed.resize(plain.len() + plain.len().div_ceil(MAX_PIECE) * TAG, 0);
        let mut at = 0;
        for piece in plain.chunks(MAX_PIECE) {
            at += cipher
                .noise
                .write_message(*nonce, piece, &mut sealed[at..at + piece.len() + TAG])
                .map_err(|e| self.failed(format!("cannot seal a frame: {e}")))?;
            *nonce += 1;
        }
        raw_send(&self.conn, sealed)
    }

    /// The next frame, or `None` after `timeout_ms`.
    pub fn recv(&self, timeout_ms: u64) -> Result<Option<Vec<u8>>, RingError> {
        let Some(cipher) = &self.cipher else {
            return raw_recv(&self.conn, timeout_ms);
        };
        let mut open = cipher.open.lock().unwrap_or_else(|e| e.into_inner());
        let Opener { nonce, piece } = &mut *open;
        let Some(next) = *nonce else {
            return Err(self.failed("the link was closed after a frame failed to authenticate"));
        };
        let Some(mut frame) = raw_recv(&self.conn, timeout_ms)? else {
            return Ok(None);
        };
        match open_in_place(&cipher.noise, next, &mut frame, piece) {
            Ok(pieces) => {
                *nonce = Some(next + pieces);
                Ok(Some(frame))
            }
            Err(why) => {
                *nonce = None;
                self.conn.close();
                Err(self.failed(format!(
                    "a frame failed to authenticate ({why}): it was replayed, reordered, altered or cut; the link is closed"
                )))
            }
        }
    }

    fn failed(&self, reason: impl Into<String>) -> RingError {
        RingError::Link {
            peer: self.conn.peer().into_string(),
            reason: reason.into(),
        }
    }
}

/// Opens the sealed pieces of `frame` (nonces from `nonce` on) and leaves the plain frame
/// in its place; `piece` is scratch space. The number of pieces, or why it failed.
fn open_in_place(
    noise: &StatelessTransportState,
    nonce: u64,
    frame: &mut Vec<u8>,
    piece: &mut Vec<u8>,
) -> Result<u64, String> {
    let sealed_len = frame.len();
    let n_pieces = sealed_len.div_ceil(MAX_SEALED);
    if sealed_len == 0 || sealed_len - (n_pieces - 1) * MAX_SEALED <= TAG {
        return Err(format!("{sealed_len} bytes is no whole sealed frame"));
    }
    piece.resize(MAX_PIECE, 0);
    // Piece i's plain text lands before its sealed bytes (minus the length prefix for
    // i = 0), so writing it back never overwrites what is still to be read.
    let mut plain_len = 0usize;
    for i in 0..n_pieces {
        let start = i * MAX_SEALED;
        let end = (start + MAX_SEALED).min(sealed_len);
        let n = noise
            .read_message(nonce + i as u64, &frame[start..end], piece)
            .map_err(|e| e.to_string())?;
        let skip = if i == 0 { LEN_PREFIX.min(n) } else { 0 };
        let out = (i * MAX_PIECE + skip).saturating_sub(LEN_PREFIX);
        frame[out..out + n - skip].copy_from_slice(&piece[skip..n]);
        if i == 0 {
            if n < LEN_PREFIX {
                return Err("no length".into());
            }
            let mut len = [0u8; LEN_PREFIX];
            len.copy_from_slice(&piece[..LEN_PREFIX]);
            plain_len = u64::from_le_bytes(len) as usize;
        }
    }
    let opened = sealed_len - n_pieces * TAG - LEN_PREFIX;
    if opened != plain_len {
        return Err(format!(
            "{opened} bytes arrived of a {plain_len}-byte frame"
        ));
    }
    frame.truncate(plain_len);
    Ok(n_pieces as u64)
}

fn raw_send(conn: &ConnectionBox, frame: &[u8]) -> Result<(), RingError> {
    match conn.send(RSlice::from_slice(frame)) {
        RResult::ROk(()) => Ok(()),
        RResult::RErr(e) => Err(RingError::Transport(e.into_string())),
    }
}

fn raw_recv(conn: &ConnectionBox, timeout_ms: u64) -> Result<Option<Vec<u8>>, RingError> {
    match conn.recv(timeout_ms) {
        RResult::ROk(frame) => Ok(frame.into_option().map(|f| f.into_vec())),
        RResult::RErr(e) => Err(RingError::Transport(e.into_string())),
    }
}

fn noise(security: &LinkSecurity, initiator: bool) -> Option<Result<HandshakeState, snow::Error>> {
    let LinkSecurity::Key(key) = security else {
        return None;
    };
    let build = || {
        let builder = snow::Builder::new(NOISE_PARAMS.parse()?)
            .prologue(PROLOGUE)?
            .psk(0, key.bytes())?;
        if initiator {
            builder.build_initiator()
        } else {
            builder.build_responder()
        }
    };
    Some(build())
}

fn opening(mode: u8, message: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(MAGIC.len() + 1 + message.len());
    frame.extend_from_slice(MAGIC);
    frame.push(mode);
    frame.extend_from_slice(message);
    frame
}

/// The mode and handshake message of an opening frame (or its answer).
fn parse_opening(frame: &[u8]) -> Option<(u8, &[u8])> {
    let rest = frame.strip_prefix(MAGIC)?;
    let (&mode, message) = rest.split_first()?;
    Some((mode, message))
}

/// The connecting side of the handshake.
fn initiate(
    conn: &ConnectionBox,
    addr: &str,
    timeout_ms: u64,
    security: &LinkSecurity,
) -> Result<Option<Cipher>, RingError> {
    let refused = |reason: String| RingError::Link {
        peer: addr.to_string(),
        reason,
    };
    let handshake_err = |e: snow::Error| refused(format!("link handshake: {e}"));
    let mut noise = noise(security, true).transpose().map_err(handshake_err)?;
    let mut buf = vec![0u8; MAX_SEALED];
    let open = match &mut noise {
        Some(hs) => {
            let n = hs.write_message(&[], &mut buf).map_err(handshake_err)?;
            opening(MODE_NOISE, &buf[..n])
        }
        None => opening(MODE_PLAIN, &[]),
    };
    raw_send(conn, &open)?;
    let answer = raw_recv(conn, timeout_ms)?.ok_or_else(|| {
        refused(format!(
            "no answer to the link handshake within {} s",
            timeout_ms / 1000
        ))
    })?;
    if let Ok(Frame::Control(Control::Refused { reason })) = decode(&answer) {
        return Err(refused(format!("refused this device's link: {reason}")));
    }
    match (noise, parse_opening(&answer)) {
        (Some(mut hs), Some((MODE_NOISE, message))) => {
            hs.read_message(message, &mut buf).map_err(|_| {
                refused(
                    "the link handshake failed: this peer does not hold the cluster key (or the link was tampered with)"
                        .into(),
                )
            })?;
            Ok(Some(cipher(hs).map_err(handshake_err)?))
        }
        (None, Some((MODE_PLAIN, []))) => Ok(None),
        _ => Err(refused(format!(
            "answered the link handshake with {} bytes that are no handshake",
            answer.len()
        ))),
    }
}

/// The accepting side of the handshake: `Err` is the reason the peer is refused.
fn respond(
    conn: &ConnectionBox,
    timeout_ms: u64,
    security: &LinkSecurity,
) -> Result<Option<Cipher>, String> {
    let first = match raw_recv(conn, timeout_ms) {
        Ok(Some(f)) => f,
        Ok(None) => return Err(format!("sent nothing within {} s", timeout_ms / 1000)),
        Err(e) => return Err(format!("the connection failed during the handshake: {e}")),
    };
    let Some((mode, message)) = parse_opening(&first) else {
        return Err(match security {
            LinkSecurity::Key(_) => "plain ring frames without a link handshake: this device only admits peers holding the cluster key (give the peer the key file)".into(),
            LinkSecurity::Insecure => "ring frames without a link handshake (a prima too old for this device?)".into(),
        });
    };
    let noise = noise(security, false)
        .transpose()
        .map_err(|e| format!("link handshake: {e}"))?;
    match (noise, mode) {
        (Some(mut hs), MODE_NOISE) => {
            let mut buf = vec![0u8; MAX_SEALED];
            hs.read_message(message, &mut buf).map_err(|_| {
                "the link handshake failed: the peer holds another cluster key".to_string()
            })?;
            let n = hs
                .write_message(&[], &mut buf)
                .map_err(|e| format!("link handshake: {e}"))?;
            raw_send(conn, &opening(MODE_NOISE, &buf[..n])).map_err(|e| e.to_string())?;
            Ok(Some(
                cipher(hs).map_err(|e| format!("link handshake: {e}"))?,
            ))
        }
        (Some(_), MODE_PLAIN) => Err(
            "the peer runs --insecure (a plain link), this device requires the cluster key".into(),
        ),
        (None, MODE_PLAIN) => {
            raw_send(conn, &opening(MODE_PLAIN, &[])).map_err(|e| e.to_string())?;
            Ok(None)
        }
        (None, MODE_NOISE) => Err(
            "the peer wants an encrypted link, this device runs --insecure (plain links)".into(),
        ),
        (_, other) => Err(format!("unknown link mode {other:#04x}")),
    }
}

fn cipher(hs: HandshakeState) -> Result<Cipher, snow::Error> {
    Ok(Cipher {
        noise: hs.into_stateless_transport_mode()?,
        seal: Mutex::new(Sealer::default()),
        open: Mutex::new(Opener {
            nonce: Some(0),
            piece: Vec::new(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    use abi_stable::sabi_trait::TD_Opaque;
    use abi_stable::std_types::{RErr, RNone, ROk, ROption, RSome, RVec};

    use super::*;
    use crate::prp::key::ClusterKey;
    use crate::prp::protocol::Role;
    use prima_abi::transport::{Connection, Connection_TO, TransportResult};

    /// One end of an in-memory connection; what it sends is also recorded.
    struct Mem {
        tx: Mutex<Option<mpsc::Sender<Vec<u8>>>>,
        rx: Mutex<mpsc::Receiver<Vec<u8>>>,
        sent: Arc<Mutex<Vec<Vec<u8>>>>,
        name: &'static str,
    }

    impl Connection for Mem {
        fn send(&self, frame: RSlice<'_, u8>) -> TransportResult<()> {
            self.sent.lock().unwrap().push(frame.to_vec());
            match self
                .tx
                .lock()
                .unwrap()
                .as_ref()
                .map(|t| t.send(frame.to_vec()))
            {
                Some(Ok(())) => ROk(()),
                _ => RErr("closed".into()),
            }
        }
        fn recv(&self, timeout_ms: u64) -> TransportResult<ROption<RVec<u8>>> {
            let wait = Duration::from_millis(timeout_ms.min(10_000));
            match self.rx.lock().unwrap().recv_timeout(wait) {
                Ok(f) => ROk(RSome(f.into())),
                Err(mpsc::RecvTimeoutError::Timeout) => ROk(RNone),
                Err(mpsc::RecvTimeoutError::Disconnected) => RErr("closed".into()),
            }
        }
        fn peer(&self) -> RString {
            self.name.into()
        }
        fn close(&self) {
            self.tx.lock().unwrap().take();
        }
    }

    /// A connected pair (client, server), what the client sent, and a way to put frames
    /// on the wire to the server as if the client had sent them.
    struct Pair {
        client: ConnectionBox,
        server: ConnectionBox,
        client_sent: Arc<Mutex<Vec<Vec<u8>>>>,
        to_server: mpsc::Sender<Vec<u8>>,
    }

    fn pair() -> Pair {
        let (to_server, server_rx) = mpsc::channel();
        let (to_client, client_rx) = mpsc::channel();
        let client_sent = Arc::new(Mutex::new(Vec::new()));
        let end = |tx, rx, sent, name| {
            Connection_TO::from_value(
                Mem {
                    tx: Mutex::new(Some(tx)),
                    rx: Mutex::new(rx),
                    sent,
                    name,
                },
                TD_Opaque,
            )
        };
        Pair {
            client: end(to_server.clone(), client_rx, client_sent.clone(), "server"),
            server: end(to_client, server_rx, Arc::default(), "client"),
            client_sent,
            to_server,
        }
    }

    fn key(byte: u8) -> LinkSecurity {
        LinkSecurity::Key(ClusterKey::from_bytes([byte; 32]))
    }

    /// The client's and the server's outcome of a handshake, what the client sent, and
    /// the wire to the server.
    type Handshake = (
        Result<Link, RingError>,
        Result<Link, RingError>,
        Arc<Mutex<Vec<Vec<u8>>>>,
        mpsc::Sender<Vec<u8>>,
    );

    fn handshake(pair: Pair, client: &LinkSecurity, server: &LinkSecurity) -> Handshake {
        let Pair {
            client: c,
            server: s,
            client_sent,
            to_server,
        } = pair;
        let server = server.clone();
        let accepting = std::thread::spawn(move || Link::accept(s, 2_000, &server));
        let opened = Link::open(c, "server", 2_000, client);
        (opened, accepting.join().unwrap(), client_sent, to_server)
    }

    #[test]
    fn sealed_frames_round_trip_at_every_size_and_hide_their_bytes() {
        let (client, server, sent, _) = handshake(pair(), &key(7), &key(7));
        let (client, server) = (client.unwrap(), server.unwrap());
        assert!(client.is_sealed() && server.is_sealed());
        for len in [
            0,
            1,
            MAX_PIECE - LEN_PREFIX,
            MAX_PIECE - LEN_PREFIX + 1,
            200_000,
        ] {
            let frame: Vec<u8> = (0..len).map(|i| (i % 251) as u8 | 0x80).collect();
            client.send(&frame).unwrap();
            assert_eq!(server.recv(1_000).unwrap().unwrap(), frame, "{len} bytes");
            server.send(&frame).unwrap();
            assert_eq!(
                client.recv(1_000).unwrap().unwrap(),
                frame,
                "{len} bytes back"
            );
        }
        let hello = encode_control(&Control::Hello {
            protocol: 1,
            role: Role::Data,
        });
        client.send(&hello).unwrap();
        let wire = sent.lock().unwrap().last().unwrap().clone();
        assert!(!wire.windows(8).any(|w| hello.windows(8).any(|h| h == w)));
        assert_eq!(server.recv(1_000).unwrap().unwrap(), hello);
    }

    #[test]
    fn replayed_altered_and_cut_frames_fail_and_kill_the_link() {
        // Replay: the recorded frame, sent again, carries an old nonce.
        let (client, server, sent, wire) = handshake(pair(), &key(1), &key(1));
        let (client, server) = (client.unwrap(), server.unwrap());
        client.send(b"A first").unwrap();
        assert_eq!(server.recv(1_000).unwrap().unwrap(), b"A first");
        let recorded = sent.lock().unwrap().last().unwrap().clone();
        wire.send(recorded).unwrap();
        let err = server.recv(1_000).unwrap_err().to_string();
        assert!(err.contains("replayed"), "{err}");
        client.send(b"A second").ok();
        assert!(server.recv(1_000).is_err(), "the link stays dead");

        // An altered byte.
        let (client, server, sent, wire) = handshake(pair(), &key(1), &key(1));
        let (client, server) = (client.unwrap(), server.unwrap());
        client.send(b"A payload").unwrap();
        let _ = server.recv(1_000).unwrap();
        let mut altered = sent.lock().unwrap().last().unwrap().clone();
        altered[3] ^= 1;
        wire.send(altered).unwrap();
        assert!(server.recv(1_000).is_err());

        // A frame cut at a piece boundary: its pieces open, its length does not match.
        let (client, server, _, wire) = handshake(pair(), &key(1), &key(1));
        let (client, server) = (client.unwrap(), server.unwrap());
        client.send(&vec![0u8; 3 * MAX_PIECE]).unwrap();
        let whole = raw_recv(&server.conn, 1_000).unwrap().unwrap();
        assert_eq!(whole.len(), 3 * MAX_SEALED + (LEN_PREFIX + TAG));
        wire.send(whole[..3 * MAX_SEALED].to_vec()).unwrap();
        let err = server.recv(1_000).unwrap_err().to_string();
        assert!(err.contains("bytes arrived of a"), "{err}");
    }

    #[test]
    fn peers_without_the_key_are_refused_with_the_reason_on_both_sides() {
        let (client, server, _, _) = handshake(pair(), &key(1), &key(2));
        let client = client.err().unwrap().to_string();
        let server = server.err().unwrap().to_string();
        assert!(server.contains("another cluster key"), "{server}");
        assert!(
            client.contains("refused") && client.contains("another cluster key"),
            "{client}"
        );

        let (client, server, _, _) = handshake(pair(), &LinkSecurity::Insecure, &key(1));
        let (client, server) = (
            client.err().unwrap().to_string(),
            server.err().unwrap().to_string(),
        );
        assert!(server.contains("--insecure"), "{server}");
        assert!(client.contains("requires the cluster key"), "{client}");

        let (client, server, _, _) = handshake(pair(), &key(1), &LinkSecurity::Insecure);
        let (client, server) = (
            client.err().unwrap().to_string(),
            server.err().unwrap().to_string(),
        );
        assert!(server.contains("wants an encrypted link"), "{server}");
        assert!(client.contains("runs --insecure"), "{client}");

        let (client, server, _, _) =
            handshake(pair(), &LinkSecurity::Insecure, &LinkSecurity::Insecure);
        assert!(!client.unwrap().is_sealed() && !server.unwrap().is_sealed());
    }

    #[test]
    fn plain_ring_frames_are_refused_before_they_are_read() {
        let Pair { client, server, .. } = pair();
        let hello = encode_control(&Control::Hello {
            protocol: 1,
            role: Role::Control,
        });
        raw_send(&client, &hello).unwrap();
        let err = Link::accept(server, 1_000, &key(3))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("plain ring frames"), "{err}");
        let answer = raw_recv(&client, 1_000).unwrap().unwrap();
        let Ok(Frame::Control(Control::Refused { reason })) = decode(&answer) else {
            panic!("expected a refusal");
        };
        assert!(reason.contains("cluster key"), "{reason}");
    }

    /// What sealing and opening cost per frame (`cargo test --release -p prima-core --lib
    /// seal_and_open_cost -- --ignored --nocapture`): one token's activations of SmolLM2
    /// (576 f32s and the header) and a 64-token batch.
    #[test]
    #[ignore]
    fn seal_and_open_cost() {
        let (client, server, _, _) = handshake(pair(), &key(9), &key(9));
        let (client, server) = (client.unwrap(), server.unwrap());
        for tokens in [1usize, 64] {
            let frame = vec![0x5au8; 24 + tokens * 576 * 4];
            let reps = 20_000 / tokens;
            let started = std::time::Instant::now();
            for _ in 0..reps {
                client.send(&frame).unwrap();
                let _ = server.recv(1_000).unwrap().unwrap();
            }
            let sealed = started.elapsed().as_secs_f64() / reps as f64;
            let (plain_c, plain_s, _, _) =
                handshake(pair(), &LinkSecurity::Insecure, &LinkSecurity::Insecure);
            let (plain_c, plain_s) = (plain_c.unwrap(), plain_s.unwrap());
            let started = std::time::Instant::now();
            for _ in 0..reps {
                plain_c.send(&frame).unwrap();
                let _ = plain_s.recv(1_000).unwrap().unwrap();
            }
            let plain = started.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{tokens} token(s), {} bytes: sealed {:.1} µs, plain {:.1} µs per frame (in-memory link)",
                frame.len(),
                sealed * 1e6,
                plain * 1e6
            );
        }
    }
}
