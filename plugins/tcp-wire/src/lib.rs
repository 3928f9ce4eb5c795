//! Prima's TCP transport: length-delimited frames over TCP with `TCP_NODELAY`. The code
//! of the `tcp` plugin (`plugins/transport-tcp`, which only exports it) and the data path
//! of `vpn-proxy`, which reaches peers through relays and then speaks this.
//!
//! Every connection starts with an 8-byte hello from the connecting side (`PRTC` and the
//! transport's wire version, little-endian u32), so a stray client or a peer speaking
//! another version is refused before any frame is read. Frames are a big-endian u32 length
//! (of the payload alone) and the payload: byte for byte what tokio-util's
//! `LengthDelimitedCodec` with its default layout writes, which earlier versions used, so
//! old and new peers still talk.
//!
//! Everything runs on std's blocking sockets, with no async runtime: connecting tries each
//! resolved address with `connect_timeout`, accepting polls a non-blocking listener until
//! its deadline, and the hello is read under a socket read timeout. On the data path a
//! frame leaves in one `writev`, and the thread in `recv` sleeps in the socket read
//! itself, so a frame's arrival wakes it directly and one read usually takes the whole
//! frame (with epoll in between, a hop cost a wake-up plus two or three system calls).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, RNone, ROk, ROption, RSlice, RSome, RString, RVec};
use prima_abi::transport::{
    Connection, ConnectionBox, Connection_TO, Listener, ListenerBox, Listener_TO, Transport,
    TransportBox, TransportConfig, TransportResult, Transport_TO, NO_TIMEOUT,
};

/// Magic and version every connection opens with.
const HELLO_MAGIC: &[u8; 4] = b"PRTC";
const WIRE_VERSION: u32 = 1;
/// How long an accepted peer has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest sleep between two looks at a listener with no pending connection: short
/// enough that accepting adds no noticeable delay to joining a ring.
const ACCEPT_POLL_MAX: Duration = Duration::from_millis(10);

/// The `create` function of a plugin exporting this transport.
pub extern "C" fn create_transport(config: TransportConfig) -> TransportResult<TransportBox> {
    match TcpTransport::new(config) {
        Ok(t) => ROk(Transport_TO::from_value(t, TD_Opaque)),
        Err(e) => RErr(RString::from(e)),
    }
}

/// The TCP transport: the frame limit its listeners and connections share.
pub struct TcpTransport {
    max_frame: usize,
}

impl TcpTransport {
    pub fn new(config: TransportConfig) -> Result<TcpTransport, String> {
        let max_frame = usize::try_from(config.max_frame_bytes)
            .unwrap_or(usize::MAX)
            .max(1024)
            // The length field is a u32.
            .min(u32::MAX as usize);
        Ok(TcpTransport { max_frame })
    }
}

/// When a wait of `timeout_ms` started now ends; `None` for no limit.
fn deadline(timeout_ms: u64) -> Option<Instant> {
    if timeout_ms == NO_TIMEOUT {
        None
    } else {
        Instant::now().checked_add(Duration::from_millis(timeout_ms))
    }
}

/// The hello a connecting side sends first.
fn hello() -> [u8; 8] {
    let mut hello = [0u8; 8];
    hello[..4].copy_from_slice(HELLO_MAGIC);
    hello[4..].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    hello
}

/// Connects to the first of `addrs` that answers before `deadline`, each try given the
/// time left. The error names `addr` and, when several addresses failed, the last reason.
fn connect_any(
    addr: &str,
    addrs: &[SocketAddr],
    deadline: Option<Instant>,
    timeout_ms: u64,
) -> Result<std::net::TcpStream, String> {
    let no_answer = || format!("connecting to {addr}: no answer within {timeout_ms} ms");
    let mut last_error = None;
    for one in addrs {
        let tried = match deadline {
            None => std::net::TcpStream::connect(one),
            Some(end) => {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(no_answer());
                }
                std::net::TcpStream::connect_timeout(one, left)
            }
        };
        match tried {
            Ok(stream) => return Ok(stream),
            Err(e) => last_error = Some(e),
        }
    }
    match last_error {
        Some(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => {
            Err(no_answer())
        }
        Some(e) => Err(format!("connecting to {addr}: {e}")),
        None => Err(format!(
            "connecting to {addr}: the name resolves to no address"
        )),
    }
}

impl TcpTransport {
    /// Largest frame accepted from a peer.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }
}

/// Opens a connection over a stream that already reaches the peer (through a relay, say):
/// sends the hello and hands the socket to the blocking data path, as `connect` does.
pub fn connect_over(
    stream: std::net::TcpStream,
    peer: String,
    max_frame: usize,
) -> Result<ConnectionBox, String> {
    (&stream)
        .write_all(&hello())
        .map_err(|e| format!("connecting to {peer}: {e}"))?;
    let handle = ConnectionHandle::from_std(stream, peer, max_frame)?;
    Ok(Connection_TO::from_value(handle, TD_Opaque))
}

impl Transport for TcpTransport {
    fn name(&self) -> RString {
        "tcp".into()
    }

    fn listen(&self, addr: RString) -> TransportResult<ListenerBox> {
        // Non-blocking for good: `accept` polls it until its deadline, so no thread is
        // ever stuck in an accept that outlives the listener.
        let result = std::net::TcpListener::bind(addr.as_str())
            .and_then(|listener| listener.set_nonblocking(true).map(|()| listener));
        match result {
            Ok(listener) => ROk(Listener_TO::from_value(
                TcpListener {
                    listener,
                    max_frame: self.max_frame,
                },
                TD_Opaque,
            )),
            Err(e) => RErr(format!("cannot listen on {addr}: {e}").into()),
        }
    }

    fn connect(&self, addr: RString, timeout_ms: u64) -> TransportResult<ConnectionBox> {
        if addr.contains(prima_abi::transport::VIA) {
            return RErr(
                format!("connecting to {addr}: the tcp transport cannot go through a relay (use the vpn-proxy transport)")
                    .into(),
            );
        }
        let max_frame = self.max_frame;
        let end = deadline(timeout_ms);
        let result = addr
            .as_str()
            .to_socket_addrs()
            .map_err(|e| format!("connecting to {addr}: {e}"))
            .and_then(|addrs| {
                let addrs: Vec<SocketAddr> = addrs.collect();
                connect_any(&addr, &addrs, end, timeout_ms)
            })
            .and_then(|stream| {
                // The hello is 8 bytes into an empty socket buffer: it never waits.
                (&stream)
                    .write_all(&hello())
                    .map(|()| stream)
                    .map_err(|e| format!("connecting to {addr}: {e}"))
            });
        match result.and_then(|s| ConnectionHandle::from_std(s, addr.to_string(), max_frame)) {
            Ok(c) => ROk(Connection_TO::from_value(c, TD_Opaque)),
            Err(e) => RErr(e.into()),
        }
    }
}

pub struct TcpListener {
    /// Non-blocking: see `listen`.
    listener: std::net::TcpListener,
    max_frame: usize,
}

impl TcpListener {
    /// The next pending connection, or `None` once `deadline` has passed without one.
    fn next_pending(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<(std::net::TcpStream, SocketAddr)>, String> {
        let mut pause = Duration::from_millis(1);
        loop {
            match self.listener.accept() {
                Ok(accepted) => return Ok(Some(accepted)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("accept failed: {e}")),
            }
            let nap = match deadline {
                None => pause,
                Some(end) => {
                    let left = end.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    pause.min(left)
                }
            };
            std::thread::sleep(nap);
            pause = (pause * 2).min(ACCEPT_POLL_MAX);
        }
    }
}

/// Reads and checks the hello of a peer just accepted, waiting at most `HELLO_TIMEOUT`.
fn read_hello(stream: &std::net::TcpStream, peer: &SocketAddr) -> Result<(), String> {
    // Some systems hand out accepted sockets non-blocking like their listener.
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(HELLO_TIMEOUT)))
        .map_err(|e| format!("{peer}: socket error: {e}"))?;
    let mut hello = [0u8; 8];
    let mut reader = stream;
    match reader.read_exact(&mut hello) {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(format!("{peer}: sent no hello within 5 s"))
        }
        Err(e) => return Err(format!("{peer}: closed before its hello: {e}")),
    }
    if &hello[..4] != HELLO_MAGIC {
        return Err(format!("{peer}: not a Prima TCP peer (bad hello)"));
    }
    let version = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]);
    if version != WIRE_VERSION {
        return Err(format!(
            "{peer}: speaks TCP wire version {version}, this node speaks {WIRE_VERSION}"
        ));
    }
    Ok(())
}

impl Listener for TcpListener {
    fn local_addr(&self) -> RString {
        match self.listener.local_addr() {
            Ok(a) => a.to_string().into(),
            Err(_) => RString::new(),
        }
    }

    fn accept(&self, timeout_ms: u64) -> TransportResult<ROption<ConnectionBox>> {
        let result = self.next_pending(deadline(timeout_ms)).and_then(|pending| {
            let Some((stream, peer)) = pending else {
                return Ok(None);
            };
            read_hello(&stream, &peer)?;
            Ok(Some((stream, peer.to_string())))
        });
        let made = result.and_then(|accepted| match accepted {
            Some((s, peer)) => ConnectionHandle::from_std(s, peer, self.max_frame).map(Some),
            None => Ok(None),
        });
        match made {
            Ok(Some(c)) => ROk(RSome(Connection_TO::from_value(c, TD_Opaque))),
            Ok(None) => ROk(RNone),
            Err(e) => RErr(e.into()),
        }
    }
}

/// Bytes read from the socket and not yet handed out as frames, and the read timeout the
/// socket was last given.
struct Inbox {
    /// Starts at a frame's length field.
    buf: Vec<u8>,
    /// Zeroed once: every read lands here and is copied to `buf`, so the thread never
    /// zeroes a buffer before a read (work that would compete, on a small machine, with
    /// the device it has just woken).
    landing: Vec<u8>,
    max_frame: usize,
    /// `None` until first set; then the socket's current `SO_RCVTIMEO`.
    timeout: Option<Option<Duration>>,
}

/// The most one read takes: a one-token frame of any model arrives whole.
const READ_BYTES: usize = 64 << 10;

impl Inbox {
    /// The next frame, reading from `socket` (blocking, so the waiting thread sleeps in
    /// the read itself and the frame's arrival wakes it directly). `None` when no byte
    /// came for `timeout_ms`; a partly received frame is kept for the next call.
    fn next_frame(
        &mut self,
        socket: &std::net::TcpStream,
        timeout_ms: u64,
        peer: &str,
    ) -> Result<Option<RVec<u8>>, String> {
        let timeout = (timeout_ms != NO_TIMEOUT).then(|| Duration::from_millis(timeout_ms.max(1)));
        loop {
            if let Some(head) = self.buf.get(..4) {
                let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
                if len > self.max_frame {
                    // Left in place: the connection is unusable from here on, and every
                    // later call says so again.
                    return Err(format!(
                        "receiving from {peer}: a frame of {len} bytes is over the limit of {} bytes",
                        self.max_frame
                    ));
                }
                if self.buf.len() >= 4 + len {
                    let frame = RVec::from(&self.buf[4..4 + len]);
                    self.buf.drain(..4 + len);
                    return Ok(Some(frame));
                }
                self.buf.reserve(4 + len - self.buf.len());
            }
            if self.timeout != Some(timeout) {
                socket
                    .set_read_timeout(timeout)
                    .map_err(|e| format!("receiving from {peer}: {e}"))?;
                self.timeout = Some(timeout);
            }
            let mut reader = socket;
            match reader.read(&mut self.landing) {
                Ok(0) => return Err(format!("{peer} closed the connection")),
                Ok(n) => self.buf.extend_from_slice(&self.landing[..n]),
                // Timed out: what came of a frame stays for the next call.
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(None)
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("receiving from {peer}: {e}")),
            }
        }
    }
}

/// One connection: a blocking socket with a lock per direction, so one thread can send
/// while another receives. No runtime on the data path: a frame goes out in one `writev`
/// and comes in through a read the receiving thread sleeps in.
pub struct ConnectionHandle {
    socket: std::net::TcpStream,
    inbox: std::sync::Mutex<Inbox>,
    /// Held for the whole of a frame, so frames from two threads never interleave.
    sending: std::sync::Mutex<()>,
    max_frame: usize,
    peer: String,
    closed: AtomicBool,
}

impl ConnectionHandle {
    fn from_std(
        socket: std::net::TcpStream,
        peer: String,
        max_frame: usize,
    ) -> Result<ConnectionHandle, String> {
        socket
            .set_nodelay(true)
            .map_err(|e| format!("{peer}: cannot set TCP_NODELAY: {e}"))?;
        socket
            .set_nonblocking(false)
            .map_err(|e| format!("{peer}: socket error: {e}"))?;
        Ok(ConnectionHandle {
            socket,
            inbox: std::sync::Mutex::new(Inbox {
                buf: Vec::new(),
                landing: vec![0; READ_BYTES],
                max_frame,
                timeout: None,
            }),
            sending: std::sync::Mutex::new(()),
            max_frame,
            peer,
            closed: AtomicBool::new(false),
        })
    }
}

/// What is left of `header` then `payload` after the first `written` bytes of both.
fn unsent<'a>(header: &'a [u8], payload: &'a [u8], written: usize) -> [&'a [u8]; 2] {
    match written.checked_sub(header.len()) {
        None => [&header[written..], payload],
        Some(into_payload) => [&[], &payload[into_payload..]],
    }
}

/// Writes `header` then `payload`, in one `writev` unless the socket buffer is full.
fn write_frame(socket: &std::net::TcpStream, header: &[u8], payload: &[u8]) -> std::io::Result<()> {
    use std::io::IoSlice;
    let mut socket = socket;
    let total = header.len() + payload.len();
    let mut written = 0;
    while written < total {
        let [h, p] = unsent(header, payload, written);
        match socket.write_vectored(&[IoSlice::new(h), IoSlice::new(p)]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Connection for ConnectionHandle {
    fn send(&self, frame: RSlice<'_, u8>) -> TransportResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return RErr(format!("{}: connection already closed", self.peer).into());
        }
        let payload = frame.as_slice();
        if payload.len() > self.max_frame {
            return RErr(
                format!(
                    "sending to {}: a frame of {} bytes is over the limit of {} bytes",
                    self.peer,
                    payload.len(),
                    self.max_frame
                )
                .into(),
            );
        }
        let header = (payload.len() as u32).to_be_bytes();
        let _one_frame_at_a_time = self.sending.lock().unwrap_or_else(|e| e.into_inner());
        match write_frame(&self.socket, &header, payload) {
            Ok(()) => ROk(()),
            Err(e) => RErr(format!("sending to {}: {e}", self.peer).into()),
        }
    }

    fn recv(&self, timeout_ms: u64) -> TransportResult<ROption<RVec<u8>>> {
        if self.closed.load(Ordering::Acquire) {
            return RErr(format!("{}: connection already closed", self.peer).into());
        }
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        match inbox.next_frame(&self.socket, timeout_ms, &self.peer) {
            Ok(Some(frame)) => ROk(RSome(frame)),
            Ok(None) => ROk(RNone),
            Err(e) => RErr(e.into()),
        }
    }

    fn peer(&self) -> RString {
        self.peer.as_str().into()
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // Also wakes a thread blocked in a read or write on this socket.
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for ConnectionHandle {
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
    }
}
