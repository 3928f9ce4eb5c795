//! Per-operation arguments (each dispatch's uniform `P`, get_rows' ids, RoPE's cos/sin
//! table) for the commands recorded since the last wait.
//!
//! Every argument gets its own range of a parameter buffer, never reused before the host
//! has waited for the commands that read it: `queue.write_buffer` runs at the next submit,
//! before that submission's recorded commands, so one shared scratch buffer rewritten per
//! operation would leave every recorded dispatch reading the last operation's arguments.
//! The bytes are gathered on the host and written once per submission ([`ParamArena::flush`]);
//! after the wait the arena starts over ([`ParamArena::reset`]).

/// Bytes per parameter buffer: room for a token's worth of dispatches (a few hundred, at
/// 256 bytes each) in a handful of buffers. A larger argument gets a buffer of its own.
const CHUNK: u64 = 64 * 1024;

struct Chunk {
    buf: wgpu::Buffer,
    host: Vec<u8>,
    /// Bytes placed since the last reset, and of those, written to the device.
    used: u64,
    written: u64,
}

/// Parameter buffers handed out by a bump allocator (see the module's documentation).
pub struct ParamArena {
    chunks: Vec<Chunk>,
    /// The chunk being filled.
    current: usize,
    /// Offset alignment of a uniform or storage binding on this device.
    align: u64,
    /// Bytes placed since the backend was created (`TransferCounts::param_bytes`).
    pub total_bytes: u64,
}

/// Where one argument was placed: bind `size` bytes of `buf` from `offset`.
pub struct Placed {
    pub buf: wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

impl Placed {
    pub fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buf,
            offset: self.offset,
            size: wgpu::BufferSize::new(self.size),
        })
    }
}

impl ParamArena {
    pub fn new(limits: &wgpu::Limits) -> ParamArena {
        let align = u64::from(
            limits
                .min_uniform_buffer_offset_alignment
                .max(limits.min_storage_buffer_offset_alignment),
        )
        .max(16);
        ParamArena {
            chunks: Vec::new(),
            current: 0,
            align,
            total_bytes: 0,
        }
    }

    /// Places `bytes` (padded to 16 bytes, as uniform structs are) in a range of its own.
    pub fn push(&mut self, device: &wgpu::Device, bytes: &[u8]) -> Placed {
        let size = (bytes.len() as u64).div_ceil(16).max(1) * 16;
        self.total_bytes += size;
        let fits = |c: &Chunk| c.used.div_ceil(self.align) * self.align + size <= c.buf.size();
        while self.current < self.chunks.len() && !fits(&self.chunks[self.current]) {
            self.current += 1;
        }
        if self.current == self.chunks.len() {
            let buf = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("op parameters"),
                size: CHUNK.max(size),
                usage: wgpu::BufferUsages::UNIFORM
                    | wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.chunks.push(Chunk {
                host: Vec::with_capacity(buf.size() as usize),
                buf,
                used: 0,
                written: 0,
            });
        }
        let c = &mut self.chunks[self.current];
        let offset = c.used.div_ceil(self.align) * self.align;
        c.host.resize(offset as usize, 0);
        c.host.extend_from_slice(bytes);
        c.host.resize((offset + size) as usize, 0);
        c.used = offset + size;
        Placed {
            buf: c.buf.clone(),
            offset,
            size,
        }
    }

    /// Writes what was placed since the last flush; it reaches the device at the next
    /// submit, before that submission's commands.
    pub fn flush(&mut self, queue: &wgpu::Queue) {
        for c in &mut self.chunks {
            if c.used > c.written {
                let from = c.written as usize;
                queue.write_buffer(&c.buf, c.written, &c.host[from..c.used as usize]);
                c.written = c.used;
            }
        }
    }

    /// The device has run every command that read the arena: start over. Chunks of their
    /// own (larger than [`CHUNK`]) are let go, the others kept; says whether any was let
    /// go (bind groups naming it should be too).
    pub fn reset(&mut self) -> bool {
        let before = self.chunks.len();
        self.chunks.retain(|c| c.buf.size() <= CHUNK);
        let dropped = self.chunks.len() < before;
        for c in &mut self.chunks {
            c.host.clear();
            c.used = 0;
            c.written = 0;
        }
        self.current = 0;
        dropped
    }
}
