//! The backend's compute resources: persistent worker threads, and scratch buffers reused
//! across calls so the per-token path does not allocate once they have grown.
//!
//! Ops hand the pool "run chunks `0..n` of this job" through [`ChunkRunner`], which both
//! rayon's pool and [`SpinPool`] implement. `SpinPool` is built for the decode step's many
//! small matmuls: one atomic word holds the generation and the next chunk, chunks are
//! claimed from it by compare-and-swap, the calling thread works too and never waits for a
//! worker that has not claimed anything, and idle workers spin for [`SPIN_WINDOW`]
//! before they sleep on a condvar, so an idle backend costs no CPU.

use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker polls for the next job before it sleeps.
pub const SPIN_WINDOW: Duration = Duration::from_micros(50);

/// Runs `job(c)` for every chunk `c` in `0..n_chunks` across the pool's threads and returns
/// when all have run. Chunks may run in any order and on any thread.
pub trait ChunkRunner: Sync {
    /// Threads that run chunks (the caller's included, where it takes part).
    fn threads(&self) -> usize;
    fn run(&self, n_chunks: usize, job: &(dyn Fn(usize) + Sync));
}

impl ChunkRunner for ThreadPool {
    fn threads(&self) -> usize {
        self.current_num_threads()
    }

    fn run(&self, n_chunks: usize, job: &(dyn Fn(usize) + Sync)) {
        self.install(|| (0..n_chunks).into_par_iter().for_each(job));
    }
}

fn thread_count(threads: u32) -> usize {
    match threads {
        0 => default_threads(),
        n => n as usize,
    }
}

/// One compute thread per physical core this process may use: SMT siblings share a core's
/// execution units and its load bandwidth, so a second thread per core mostly adds
/// synchronisation. [`threads_for`] holds the rule; the physical cores are the distinct
/// (package, core) pairs under /sys/devices/system/cpu (Linux, Android), and the cores the
/// process may use are the device profile's (`prima_host::device_cores`: the
/// affinity mask, lowered by a cgroup CPU quota, so a container allowed half a core does
/// not start a thread per host core).
pub fn default_threads() -> usize {
    threads_for(
        physical_cores(std::path::Path::new("/sys/devices/system/cpu")),
        prima_host::device_cores().cores,
    )
}

/// min(physical cores, usable cores), at least 1; the usable cores alone where the
/// topology is unknown.
pub fn threads_for(physical: Option<usize>, usable: usize) -> usize {
    physical.map_or(usable, |p| p.min(usable)).max(1)
}

/// Distinct (package, core) pairs among the `cpuN/topology` directories under `root`;
/// `None` when there are none (not Linux, or no topology exposed).
pub fn physical_cores(root: &std::path::Path) -> Option<usize> {
    let mut cores = std::collections::HashSet::new();
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_prefix("cpu")) else {
            continue;
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let topology = entry.path().join("topology");
        let read = |file: &str| {
            std::fs::read_to_string(topology.join(file))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
        };
        if let (Some(package), Some(core)) = (read("physical_package_id"), read("core_id")) {
            cores.insert((package, core));
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Builds the pool once per backend: `threads` workers, or one per physical core for 0.
pub fn build_pool(threads: u32) -> Result<ThreadPool, String> {
    let n = thread_count(threads);
    ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("prima-cpu-{i}"))
        .build()
        .map_err(|e| format!("cpu backend: cannot start {n} compute threads: {e}"))
}

/// The job of one generation.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync),
    /// The chunk `base + i` is run for claim `i`.
    base: usize,
}

/// Bits of [`Shared::state`]: generation, chunk count, next chunk to claim.
const COUNT_BITS: u32 = 18;
const MAX_CHUNKS: usize = (1 << COUNT_BITS) - 1;
const INDEX_MASK: u64 = MAX_CHUNKS as u64;

fn pack(generation: u64, n: usize, next: usize) -> u64 {
    (generation << (2 * COUNT_BITS)) | ((n as u64) << COUNT_BITS) | next as u64
}

fn unpack(state: u64) -> (u64, usize, usize) {
    (
        state >> (2 * COUNT_BITS),
        ((state >> COUNT_BITS) & INDEX_MASK) as usize,
        (state & INDEX_MASK) as usize,
    )
}

/// Keeps a hot atomic on a cache line of its own, so claims and completions do not
/// bounce one line between the cores (128 bytes: adjacent-line prefetch pairs lines).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    /// `generation | n_chunks | next`: a chunk is claimed by a compare-and-swap that
    /// checks the generation, so a worker that wakes late can never claim from a job
    /// whose caller has returned; the caller only waits for chunks actually claimed.
    state: Padded<AtomicU64>,
    /// Written only by the caller holding `caller`, before it publishes a new `state`, and
    /// while no claim of the previous generation is running.
    job: UnsafeCell<Job>,
    /// Chunks of the current generation that workers have finished: each worker adds its
    /// count once, when it finds nothing left to claim.
    done: Padded<AtomicUsize>,
    /// Set when a chunk panicked on a worker; the caller re-raises.
    panicked: AtomicBool,
    /// Set by [`SpinPool::park`]: idle workers sleep at once instead of finishing their
    /// spin window. Cleared when the next job is published.
    park: AtomicBool,
    /// Workers waiting on `wake`, or about to.
    sleepers: AtomicUsize,
    /// Set when a caller has notified the sleepers; cleared by a worker (under `sleep`)
    /// as it goes to sleep. While set, later jobs skip the notify: the workers it woke are
    /// on their way and will find those jobs by polling. Without it, each job of a window
    /// paid a futex call until the woken worker had run again.
    notified: AtomicBool,
    sleep: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
}

// SAFETY: `job` is written only by the thread holding `SpinPool::caller` while every
// claimed chunk of the previous generation has finished, and read only by a thread that
// has just claimed a chunk of the current generation (the caller waits for that chunk);
// the pointee is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw job pointer is only dereferenced under that protocol.
unsafe impl Send for Shared {}

/// A persistent pool of `threads − 1` workers plus the calling thread.
pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serialises callers: one job in flight at a time.
    caller: Mutex<()>,
}

impl SpinPool {
    /// `threads` threads in all (0: one per physical core), the caller counted.
    pub fn new(threads: u32) -> Result<SpinPool, String> {
        let n = thread_count(threads).max(1);
        let shared = Arc::new(Shared {
            state: Padded(AtomicU64::new(0)),
            job: UnsafeCell::new(Job {
                f: &|_| {},
                base: 0,
            }),
            done: Padded(AtomicUsize::new(0)),
            panicked: AtomicBool::new(false),
            park: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            notified: AtomicBool::new(false),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(n - 1);
        for i in 1..n {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(format!("prima-cpu-{i}"))
                .spawn(move || worker(&s))
                .map_err(|e| format!("cpu backend: cannot start {n} compute threads: {e}"))?;
            workers.push(h);
        }
        Ok(SpinPool {
            shared,
            workers,
            caller: Mutex::new(()),
        })
    }
}

/// Claims and runs chunks of generation `generation` until none are left; returns how
/// many it ran and whether one panicked.
fn claim_chunks(s: &Shared, generation: u64) -> (usize, bool) {
    let (mut ran, mut panicked) = (0, false);
    let mut cur = s.state.load(Acquire);
    loop {
        let (g, n, next) = unpack(cur);
        if g != generation || next >= n {
            return (ran, panicked);
        }
        match s.state.compare_exchange_weak(cur, cur + 1, AcqRel, Acquire) {
            Ok(_) => {
                // SAFETY: we hold an unfinished chunk of this generation, so its caller
                // is still waiting and the job is alive and unchanged.
                let job = unsafe { *s.job.get() };
                let f = job.f;
                // SAFETY: as above.
                let result = catch_unwind(AssertUnwindSafe(|| unsafe { (*f)(job.base + next) }));
                panicked |= result.is_err();
                ran += 1;
                cur = s.state.load(Acquire);
            }
            Err(now) => cur = now,
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut spin_start = Instant::now();
        let mut spins = 0u32;
        let generation = loop {
            let (g, n, next) = unpack(s.state.load(Acquire));
            if g != seen && next < n {
                break g;
            }
            seen = g;
            if s.shutdown.load(Acquire) {
                return;
            }
            spins += 1;
            // Read the clock (and the park flag) only every 64 polls.
            if spins & 63 != 0 || (!s.park.load(Relaxed) && spin_start.elapsed() < SPIN_WINDOW) {
                std::hint::spin_loop();
                continue;
            }
            let guard = s.sleep.lock().unwrap_or_else(|e| e.into_inner());
            s.notified.store(false, SeqCst);
            s.sleepers.fetch_add(1, SeqCst);
            if unpack(s.state.load(SeqCst)).0 == seen && !s.shutdown.load(SeqCst) {
                drop(s.wake.wait(guard).unwrap_or_else(|e| e.into_inner()));
            }
            s.sleepers.fetch_sub(1, SeqCst);
            spin_start = Instant::now();
        };
        let (ran, panicked) = claim_chunks(s, generation);
        if panicked {
            // Before `done`, so the caller that sees the count also sees the flag.
            s.panicked.store(true, Relaxed);
        }
        if ran > 0 {
            s.done.fetch_add(ran, Release);
        }
        seen = generation;
    }
}

impl SpinPool {
    /// Runs chunks `base .. base + n` (n ≤ MAX_CHUNKS) as one generation.
    fn run_round(&self, base: usize, n: usize, job: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        let generation = unpack(s.state.load(Acquire)).0 + 1;
        // SAFETY: we hold `caller` and every claimed chunk of the last generation has
        // finished, so nobody reads `job`. Erasing the lifetime is sound because we wait
        // (below) for every chunk claimed in this generation before `job` goes away, and
        // no chunk can be claimed after that.
        unsafe {
            let f: *const (dyn Fn(usize) + Sync + '_) = job;
            *s.job.get() = Job {
                f: std::mem::transmute::<
                    *const (dyn Fn(usize) + Sync + '_),
                    *const (dyn Fn(usize) + Sync + 'static),
                >(f),
                base,
            };
        }
        s.done.store(0, Relaxed);
        s.park.store(false, Relaxed);
        s.state.store(pack(generation, n, 0), SeqCst);
        if s.sleepers.load(SeqCst) > 0 && !s.notified.swap(true, SeqCst) {
            // Taking and dropping the lock orders this with a worker between its check of
            // `state` and its wait; notifying after the lock is released lets the woken
            // worker take it at once instead of waking a second time for it.
            drop(s.sleep.lock().unwrap_or_else(|e| e.into_inner()));
            s.wake.notify_all();
        }
        let (caller_ran, caller_panicked) = claim_chunks(s, generation);
        let mut spins = 0u32;
        while s.done.load(Acquire) + caller_ran != n {
            spins += 1;
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if caller_panicked || s.panicked.swap(false, Relaxed) {
            panic!("cpu backend: a compute task panicked");
        }
    }
}

impl SpinPool {
    /// Tells idle workers to sleep now rather than spin for the rest of [`SPIN_WINDOW`]:
    /// the caller knows no job follows soon (a ring device that has just passed its
    /// activations on), and on a machine shared with the next device the spinning would
    /// take a core from it.
    pub fn park(&self) {
        self.shared.park.store(true, Relaxed);
    }
}

impl ChunkRunner for SpinPool {
    fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    fn run(&self, n_chunks: usize, job: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() || n_chunks <= 1 {
            (0..n_chunks).for_each(job);
            return;
        }
        let _one_at_a_time = self.caller.lock().unwrap_or_else(|e| e.into_inner());
        for base in (0..n_chunks).step_by(MAX_CHUNKS) {
            self.run_round(base, MAX_CHUNKS.min(n_chunks - base), job);
        }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Buffers the ops borrow for the length of one call. They only ever grow.
#[derive(Default)]
pub struct Scratch {
    /// Activations converted to the weight type's vec_dot type (matmul).
    pub activations: Vec<u8>,
    /// Matmul results in weight-row-major order, before transposing to token-major.
    pub rows_by_token: Vec<f32>,
    /// Per-token side data of the row-panel kernels (activation block scales and sums).
    pub panel_aux: Vec<u8>,
    /// The few tokens' packed activations of the small-batch kernels.
    pub few_pack: Vec<u8>,
    /// Queries rounded to f16, as little-endian f16 bytes (attention).
    pub queries: Vec<u8>,
    /// cos/sin pairs of one position (rope).
    pub rope: Vec<f32>,
}

/// Resizes `buf` to `len` without shrinking its capacity.
pub fn sized<T: Default + Clone>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}
