//! Prima's TCP transport plugin: length-delimited frames over TCP with `TCP_NODELAY`.
//!
//! Every connection starts with an 8-byte hello from the connecting side (`PRTC` and the
//! transport's wire version, little-endian u32), so a stray client or a peer speaking
//! another version is refused before any frame is read. Frames are a big-endian u32 length
//! and the payload (tokio-util's `LengthDelimitedCodec`).
//!
//! The blocking calls of the ABI run their futures on tokio: listening and connecting on one
//! small runtime per transport, and each connection on a current-thread runtime of its
//! own, driven by the thread that blocks in `recv` — which sleeps in epoll until a frame
//! arrives, and is woken directly by it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RErr, RNone, ROk, ROption, RSlice, RSome, RString, RVec};
use futures_util::StreamExt;
use prima_core::plugin::transport_abi::{
    Connection, ConnectionBox, Connection_TO, Listener, ListenerBox, Listener_TO, Transport,
    TransportBox, TransportConfig, TransportResult, Transport_TO, NO_TIMEOUT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Runtime;
use tokio::sync::Mutex;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};

prima_core::export_transport_plugin!(name = "tcp", create = create_transport);

/// Magic and version every connection opens with.
const HELLO_MAGIC: &[u8; 4] = b"PRTC";
const WIRE_VERSION: u32 = 1;
/// How long an accepted peer has to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

extern "C" fn create_transport(config: TransportConfig) -> TransportResult<TransportBox> {
    match TcpTransport::new(config) {
        Ok(t) => ROk(Transport_TO::from_value(t, TD_Opaque)),
        Err(e) => RErr(RString::from(e)),
    }
}

/// The TCP transport: a runtime shared by its listeners and connections.
pub struct TcpTransport {
    rt: Arc<Runtime>,
    max_frame: usize,
}

impl TcpTransport {
    pub fn new(config: TransportConfig) -> Result<TcpTransport, String> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("prima-tcp")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("tcp transport: cannot start its runtime: {e}"))?;
        let max_frame = usize::try_from(config.max_frame_bytes)
            .unwrap_or(usize::MAX)
            .max(1024);
        Ok(TcpTransport {
            rt: Arc::new(rt),
            max_frame,
        })
    }
}

/// Runs `fut` with an optional timeout; `None` when the time ran out.
async fn within<F: std::future::Future>(timeout_ms: u64, fut: F) -> Option<F::Output> {
    if timeout_ms == NO_TIMEOUT {
        Some(fut.await)
    } else {
        tokio::time::timeout(Duration::from_millis(timeout_ms), fut)
            .await
            .ok()
    }
}

fn codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(max_frame)
        .new_codec()
}

impl Transport for TcpTransport {
    fn name(&self) -> RString {
        "tcp".into()
    }

    fn listen(&self, addr: RString) -> TransportResult<ListenerBox> {
        let result = self
            .rt
            .block_on(tokio::net::TcpListener::bind(addr.as_str()));
        match result {
            Ok(listener) => ROk(Listener_TO::from_value(
                TcpListener {
                    rt: self.rt.clone(),
                    listener,
                    max_frame: self.max_frame,
                },
                TD_Opaque,
            )),
            Err(e) => RErr(format!("cannot listen on {addr}: {e}").into()),
        }
    }

    fn connect(&self, addr: RString, timeout_ms: u64) -> TransportResult<ConnectionBox> {
        let max_frame = self.max_frame;
        let result = self.rt.block_on(async {
            let stream = within(timeout_ms, tokio::net::TcpStream::connect(addr.as_str()))
                .await
                .ok_or_else(|| format!("connecting to {addr}: no answer within {timeout_ms} ms"))?
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            let mut hello = [0u8; 8];
            hello[..4].copy_from_slice(HELLO_MAGIC);
            hello[4..].copy_from_slice(&WIRE_VERSION.to_le_bytes());
            let mut stream = stream;
            stream
                .write_all(&hello)
                .await
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            stream
                .into_std()
                .map_err(|e| format!("connecting to {addr}: {e}"))
        });
        match result.and_then(|s| ConnectionHandle::from_std(s, addr.to_string(), max_frame)) {
            Ok(c) => ROk(Connection_TO::from_value(c, TD_Opaque)),
            Err(e) => RErr(e.into()),
        }
    }
}

pub struct TcpListener {
    rt: Arc<Runtime>,
    listener: tokio::net::TcpListener,
    max_frame: usize,
}

impl Listener for TcpListener {
    fn local_addr(&self) -> RString {
        match self.listener.local_addr() {
            Ok(a) => a.to_string().into(),
            Err(_) => RString::new(),
        }
    }

    fn accept(&self, timeout_ms: u64) -> TransportResult<ROption<ConnectionBox>> {
        let result = self.rt.block_on(async {
            let Some(accepted) = within(timeout_ms, self.listener.accept()).await else {
                return Ok(None);
            };
            let (mut stream, peer) = accepted.map_err(|e| format!("accept failed: {e}"))?;
            let mut hello = [0u8; 8];
            match tokio::time::timeout(HELLO_TIMEOUT, stream.read_exact(&mut hello)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(format!("{peer}: closed before its hello: {e}")),
                Err(_) => return Err(format!("{peer}: sent no hello within 5 s")),
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
            stream
                .into_std()
                .map(|s| Some((s, peer.to_string())))
                .map_err(|e| format!("{peer}: socket error: {e}"))
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

/// The socket halves, each behind its own lock so one thread can send while another
/// receives.
pub struct TcpConnection {
    reader: Mutex<FramedRead<OwnedReadHalf, LengthDelimitedCodec>>,
    /// The write half, for the rare frame the socket buffer cannot take at once. Held (a
    /// std mutex: `send` is never called from async code) for the whole of a frame, so
    /// frames from two threads never interleave.
    writer: std::sync::Mutex<OwnedWriteHalf>,
    /// A second handle on the socket: frames are written through it directly (see
    /// `send`), and it shuts the socket down while a read is blocked.
    shutdown: std::net::TcpStream,
    max_frame: usize,
    peer: String,
    closed: AtomicBool,
}

impl TcpConnection {
    /// Registers `std` with the runtime entered by the caller.
    fn new(
        std: std::net::TcpStream,
        peer: String,
        max_frame: usize,
    ) -> Result<TcpConnection, String> {
        std.set_nodelay(true)
            .map_err(|e| format!("{peer}: cannot set TCP_NODELAY: {e}"))?;
        std.set_nonblocking(true)
            .map_err(|e| format!("{peer}: socket error: {e}"))?;
        let shutdown = std
            .try_clone()
            .map_err(|e| format!("{peer}: socket error: {e}"))?;
        let stream = tokio::net::TcpStream::from_std(std)
            .map_err(|e| format!("{peer}: socket error: {e}"))?;
        let (r, w) = stream.into_split();
        Ok(TcpConnection {
            reader: Mutex::new(FramedRead::new(r, codec(max_frame))),
            writer: std::sync::Mutex::new(w),
            shutdown,
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

/// Writes as much of `header` then `payload` as the socket takes without blocking, and
/// returns how many bytes that was.
fn write_now(
    socket: &std::net::TcpStream,
    header: &[u8],
    payload: &[u8],
) -> std::io::Result<usize> {
    use std::io::{ErrorKind, IoSlice, Write};
    let mut socket = socket;
    let total = header.len() + payload.len();
    let mut written = 0;
    while written < total {
        let [h, p] = unsent(header, payload, written);
        match socket.write_vectored(&[IoSlice::new(h), IoSlice::new(p)]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// A connection plus the runtime its futures run on: a current-thread runtime of its own,
/// so the thread blocked in `recv` is the one waiting in epoll and a frame wakes it
/// directly (one wake-up per hop, not two).
pub struct ConnectionHandle {
    // Dropped before the runtime its sockets are registered with.
    inner: TcpConnection,
    rt: Arc<Runtime>,
}

impl ConnectionHandle {
    fn from_std(
        std: std::net::TcpStream,
        peer: String,
        max_frame: usize,
    ) -> Result<ConnectionHandle, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("{peer}: cannot start a runtime: {e}"))?;
        let inner = {
            let _entered = rt.enter();
            TcpConnection::new(std, peer, max_frame)?
        };
        Ok(ConnectionHandle {
            inner,
            rt: Arc::new(rt),
        })
    }
}

impl Connection for ConnectionHandle {
    fn send(&self, frame: RSlice<'_, u8>) -> TransportResult<()> {
        let c = &self.inner;
        if c.closed.load(Ordering::Acquire) {
            return RErr(format!("{}: connection already closed", c.peer).into());
        }
        let payload = frame.as_slice();
        if payload.len() > c.max_frame {
            return RErr(
                format!(
                    "sending to {}: a frame of {} bytes is over the limit of {} bytes",
                    c.peer,
                    payload.len(),
                    c.max_frame
                )
                .into(),
            );
        }
        let header = (payload.len() as u32).to_be_bytes();
        let mut writer = c.writer.lock().unwrap_or_else(|e| e.into_inner());
        // Fast path: one writev on the (non-blocking) socket, without entering the
        // runtime. A hop's frame almost always fits the socket buffer, so the common
        // case is one system call; what does not fit is written by the runtime.
        let written = match write_now(&c.shutdown, &header, payload) {
            Ok(n) => n,
            Err(e) => return RErr(format!("sending to {}: {e}", c.peer).into()),
        };
        let total = header.len() + payload.len();
        if written == total {
            return ROk(());
        }
        let [h, p] = unsent(&header, payload, written);
        let result = self.rt.block_on(async {
            writer.write_all(h).await?;
            writer.write_all(p).await
        });
        match result {
            Ok(()) => ROk(()),
            Err(e) => RErr(format!("sending to {}: {e}", c.peer).into()),
        }
    }

    fn recv(&self, timeout_ms: u64) -> TransportResult<ROption<RVec<u8>>> {
        let c = &self.inner;
        if c.closed.load(Ordering::Acquire) {
            return RErr(format!("{}: connection already closed", c.peer).into());
        }
        let result = self.rt.block_on(async {
            let mut reader = c.reader.lock().await;
            within(timeout_ms, reader.next()).await
        });
        match result {
            None => ROk(RNone),
            Some(Some(Ok(frame))) => ROk(RSome(RVec::from(frame.to_vec()))),
            Some(Some(Err(e))) => RErr(format!("receiving from {}: {e}", c.peer).into()),
            Some(None) => RErr(format!("{} closed the connection", c.peer).into()),
        }
    }

    fn peer(&self) -> RString {
        self.inner.peer.as_str().into()
    }

    fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
        let _ = self.inner.shutdown.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for ConnectionHandle {
    fn drop(&mut self) {
        let _ = self.inner.shutdown.shutdown(std::net::Shutdown::Both);
    }
}
