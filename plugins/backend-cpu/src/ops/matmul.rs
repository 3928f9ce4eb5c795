//! `out = x · wᵀ` against weights of any supported type.
//!
//! As in ggml, each activation row is first converted once to the weight type's vec_dot
//! type; then the weight rows are split into chunks that the pool's threads claim, and
//! [`dot_rows`] runs the format's per-row `vec_dot` over its chunk for every token. For
//! prefill it tiles the chunk: a few weight rows (held in cache) against a block of tokens
//! at a time, so each weight byte comes from memory once per chunk and each activation row
//! from memory once per row tile rather than once per row. A vectorised kernel table drops
//! in through [`FormatKernels`] without touching this structure. Every output element is
//! one `vec_dot` call, so results depend neither on the thread count nor on the tiling.
//!
//! Where the level has row-panel kernels ([`PanelKernels`]) and the prompt has at least
//! [`PANEL_MIN_TOKENS`] tokens, chunks are whole panels instead: each panel's rows are
//! repacked once into a per-thread scratch buffer and dotted against every token, and the
//! kernel's token-major results go straight into `out`. Panel results equal `vec_dot` too.
//!
//! Where the level has decode kernels ([`crate::formats::FormatKernels::decode`]) and
//! there is one token, its activations are packed once and each chunk's rows go through
//! the decode kernel instead of a `vec_dot` per row. Their results equal `vec_dot` too.
//!
//! Where the level has small-batch kernels ([`crate::formats::FewKernels`]) and the batch
//! has 2 ..= their `max_tokens` tokens (continuous batching's decode steps), the tokens'
//! activations are packed once and each chunk's rows are dotted against all of them by
//! the small-batch kernel instead of `dot_rows`. Their results equal `vec_dot` too. On one
//! thread a kernel that writes token-major takes all the rows in one call, straight into
//! `out`.

use super::{expect_len, mul, OpResult, Weight};
use crate::formats::{FormatKernels, PanelKernels};
use crate::pool::{sized, ChunkRunner, Scratch};
use prima_abi::backend::TensorView;
use prima_abi::GgmlType;
use std::cell::RefCell;

/// Chunks per thread: enough to balance uneven progress, few enough to keep tasks long.
const CHUNKS_PER_THREAD: usize = 4;

/// Panel chunks per thread: more than [`CHUNKS_PER_THREAD`], since a chunk's cost does not
/// grow with its count (each panel is packed once and walks every token block whatever the
/// chunk), while the last chunks claimed decide how long one thread waits for the other: a
/// quarter of a thread's share left one core idle for up to that long in every matmul
/// (pp128 on 2 threads, F16 SmolLM2: ~4% at AVX2, ~1% at AVX-512).
const PANEL_CHUNKS_PER_THREAD: usize = 16;

/// Activation values up to which a few tokens are converted on the calling thread: a pool
/// round of its own cost more than the conversion (a 4-token decode step of SmolLM2 ran
/// 14 pool rounds a layer, 7 of them to convert 4 rows of 576 or 1536 values).
const SERIAL_CONVERT_VALUES: usize = 16 * 1024;

/// Rows a decode kernel takes a step (its vector lanes): decode chunks are whole steps.
const DECODE_STEP_ROWS: usize = 16;

/// Weight bytes of one row tile: the rows stay in L1/L2 while a token block walks them.
const ROW_TILE_BYTES: usize = 32 * 1024;

/// Activation bytes of one token block, so it stays in L2 across a row tile.
const TOKEN_TILE_BYTES: usize = 128 * 1024;

/// Packed panel bytes of one chunk (at least one panel), kept in L2 with a token block.
const CHUNK_PANEL_BYTES: usize = 256 * 1024;

/// Fewest tokens for which repacking a panel pays (below, the tiles of `dot_rows` run).
/// Where a format has small-batch kernels ([`crate::formats::FewKernels`]), they take
/// precedence up to their `max_tokens`.
pub const PANEL_MIN_TOKENS: usize = 8;

thread_local! {
    /// Each pool thread's activation row, where the panels need only its side data.
    static ACT_ROW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Each pool thread's packed panel and its token-major results, reused across calls.
    static PANEL: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Picks the kernels for a weight type (see `formats::dispatch::kernels`).
pub type KernelLookup = fn(GgmlType) -> Option<FormatKernels>;

/// A pointer the chunks of one job share; each chunk writes a disjoint range.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(pub(crate) *mut f32);
// SAFETY: only used to hand disjoint ranges of one `&mut [f32]` to concurrent chunks.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The shared pointer. A method, so closures capture the whole (Sync) wrapper rather
    /// than the raw pointer field.
    pub(crate) fn ptr(&self) -> *mut f32 {
        self.0
    }
}

/// `x` is `n_tokens × w.cols`, `out` is `n_tokens × w.rows`.
pub fn matmul(
    pool: &impl ChunkRunner,
    scratch: &mut Scratch,
    lookup: KernelLookup,
    w: &TensorView<'_>,
    x: &[f32],
    n_tokens: usize,
    out: &mut [f32],
) -> OpResult<()> {
    const OP: &str = "matmul";
    let w = Weight::from_view(OP, "weight", w)?;
    let kernels =
        lookup(w.ty).ok_or_else(|| format!("{OP}: weight type {} is not supported", w.ty))?;
    expect_len(
        OP,
        format_args!("x length ({n_tokens} tokens × {} cols)", w.cols),
        x.len(),
        mul(OP, n_tokens, w.cols)?,
    )?;
    expect_len(
        OP,
        format_args!("out length ({n_tokens} tokens × {} rows)", w.rows),
        out.len(),
        mul(OP, n_tokens, w.rows)?,
    )?;
    let act_row_bytes = kernels.vec_dot_type.row_bytes(w.cols).ok_or_else(|| {
        format!(
            "{OP}: row of {} columns is not a whole number of {}-element {} activation blocks",
            w.cols,
            kernels.vec_dot_type.block_elems(),
            kernels.vec_dot_type
        )
    })?;
    if n_tokens == 0 || w.rows == 0 {
        return Ok(());
    }
    if w.cols == 0 {
        out.fill(0.0);
        return Ok(());
    }

    let Scratch {
        activations,
        rows_by_token,
        panel_aux,
        few_pack,
        ..
    } = scratch;
    // Row panels for a prompt, where the level has them and the small-batch kernels do
    // not take the batch.
    let few_takes = |f: &crate::formats::FewKernels| (2..=f.max_tokens).contains(&n_tokens);
    let panel = kernels.panel.filter(|p| {
        !kernels.few.is_some_and(|f| few_takes(&f))
            && n_tokens >= PANEL_MIN_TOKENS
            && w.rows >= p.rows
    });
    let aux_bytes = panel.map_or(0, |p| (p.aux_bytes)(w.cols));
    let act = sized(activations, n_tokens * act_row_bytes);
    let aux = aligned(panel_aux, n_tokens * aux_bytes);
    if n_tokens == 1 || (panel.is_none() && n_tokens * w.cols <= SERIAL_CONVERT_VALUES) {
        for (a, x) in act
            .chunks_exact_mut(act_row_bytes)
            .zip(x.chunks_exact(w.cols))
        {
            (kernels.quantize_activation)(x, a);
        }
    } else {
        // Each token converted, and given its panel side data, in one pass over the pool,
        // a few tokens per chunk so the claims cost little beside the work.
        let act_out = SharedOut(act.as_mut_ptr() as *mut f32);
        let aux_out = SharedOut(aux.as_mut_ptr() as *mut f32);
        let per_chunk = n_tokens.div_ceil(pool.threads() * CHUNKS_PER_THREAD);
        // Where the panels read only the side data and no rows are left over for the tiles,
        // each activation row goes to a per-thread row (in L1) rather than the shared
        // buffer, whose lines the other threads read in the last matmul: each write there
        // first takes the line back from them (pp128 F16 on 2 threads: the conversion took
        // ~4× its one-thread CPU time).
        let private = panel.filter(|p| !p.reads_acts && w.rows % p.rows == 0);
        pool.run(n_tokens.div_ceil(per_chunk), &|c| {
            for t in c * per_chunk..((c + 1) * per_chunk).min(n_tokens) {
                // SAFETY: token `t` owns bytes `t·act_row_bytes ..` of `act` and
                // `t·aux_bytes ..` of `aux`, disjoint per token; both outlive `run`, which
                // returns when every chunk is done.
                let (a, x_aux) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(
                            (act_out.ptr() as *mut u8).add(t * act_row_bytes),
                            act_row_bytes,
                        ),
                        std::slice::from_raw_parts_mut(
                            (aux_out.ptr() as *mut u8).add(t * aux_bytes),
                            aux_bytes,
                        ),
                    )
                };
                let x = &x[t * w.cols..(t + 1) * w.cols];
                if let Some(p) = private {
                    ACT_ROW.with(|cell| {
                        let mut row = cell.borrow_mut();
                        let row = sized(&mut row, act_row_bytes);
                        (kernels.quantize_activation)(x, row);
                        (p.prep)(w.cols, row, x_aux);
                    });
                    continue;
                }
                (kernels.quantize_activation)(x, a);
                if let Some(p) = panel {
                    (p.prep)(w.cols, a, x_aux);
                }
            }
        });
    }
    let (act, aux): (&[u8], &[u8]) = (act, aux);

    // A few tokens: packed once, then each row unpacked once for all of them.
    let few = kernels.few.filter(few_takes).map(|f| {
        let pack = sized(few_pack, (f.pack_bytes)(w.cols, n_tokens));
        (f.pack)(w.cols, act, act_row_bytes, n_tokens, pack);
        (f.dot, &*pack, f.token_major)
    });
    if let Some(panel) = panel {
        let panel_rows = w.rows / panel.rows * panel.rows;
        panel_matmul(
            pool,
            panel,
            &w,
            (act, act_row_bytes),
            (aux, aux_bytes),
            n_tokens,
            out,
        );
        if panel_rows < w.rows {
            // The last few rows, fewer than a panel: the tiles below, one chunk.
            let rows = w.rows - panel_rows;
            let o = sized(rows_by_token, rows * n_tokens);
            dot_rows(&kernels, &w, panel_rows, act, act_row_bytes, n_tokens, o);
            for (t, out_row) in out.chunks_exact_mut(w.rows).enumerate() {
                for (r, v) in out_row[panel_rows..].iter_mut().enumerate() {
                    *v = o[r * n_tokens + t];
                }
            }
        }
        return Ok(());
    }

    // One token with decode kernels: the activations packed once, then whole steps of
    // rows per chunk (a chunk's last step, short, computes copies of its last row).
    if let Some(d) = kernels.decode.filter(|_| n_tokens == 1) {
        let pack = sized(few_pack, (d.pack_bytes)(w.cols, 1));
        (d.pack)(w.cols, act, act_row_bytes, 1, pack);
        let pack: &[u8] = pack;
        let steps = w.rows.div_ceil(DECODE_STEP_ROWS);
        let chunk = steps.div_ceil(pool.threads() * CHUNKS_PER_THREAD) * DECODE_STEP_ROWS;
        let dst = SharedOut(out.as_mut_ptr());
        pool.run(w.rows.div_ceil(chunk), &|c| {
            let first = c * chunk;
            let rows = chunk.min(w.rows - first);
            // SAFETY: chunk `c` owns elements `first .. first + rows` of `out`, disjoint per
            // chunk; `out` outlives `run`, which returns when every chunk is done.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(first), rows) };
            let w_rows = &w.data[first * w.row_bytes..(first + rows) * w.row_bytes];
            (d.dot)(w.cols, w_rows, w.row_bytes, pack, 1, o);
        });
        return Ok(());
    }
    // A few tokens on one thread with a kernel that writes token-major: the whole product
    // in one call, straight into `out` (its layout when the call holds every row), not
    // chunk by chunk into `rows_by_token` and copied (chunks only balance threads; the
    // copies were ~1.5% of a 4-token decode step of SmolLM2, most of it the output head's).
    if let Some((dot, pack, true)) = few.filter(|_| pool.threads() == 1) {
        dot(w.cols, w.data, w.row_bytes, pack, n_tokens, out);
        return Ok(());
    }
    // With small-batch kernels, whole steps of rows per chunk, as for decode: a chunk of 72
    // rows took five 16-row steps, the last half copies (SmolLM2's K and V, 192 rows, took
    // four steps for three; ~7% more work in a layer's products at 4 tokens).
    let chunk = match few {
        Some(_) => {
            let steps = w.rows.div_ceil(DECODE_STEP_ROWS);
            steps.div_ceil(pool.threads() * CHUNKS_PER_THREAD) * DECODE_STEP_ROWS
        }
        None => w.rows.div_ceil(pool.threads() * CHUNKS_PER_THREAD).max(1),
    };
    let n_chunks = w.rows.div_ceil(chunk);
    // One token: row-major and token-major coincide, write straight into `out`.
    if n_tokens == 1 {
        let dst = SharedOut(out.as_mut_ptr());
        pool.run(n_chunks, &|c| {
            let first = c * chunk;
            let rows = chunk.min(w.rows - first);
            // SAFETY: chunk `c` owns elements `first .. first + rows` of `out`, disjoint per
            // chunk; `out` outlives `run`, which returns when every chunk is done.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(first), rows) };
            dot_rows(&kernels, &w, first, act, act_row_bytes, 1, o);
        });
        return Ok(());
    }
    // Several tokens: each chunk fills its rows × tokens block of `rows_by_token` (weight-row
    // major, as most kernels produce it), then transposes that block into its columns of the
    // token-major `out` while it is still in cache (copies it, from token-major kernels).
    let by_row = SharedOut(sized(rows_by_token, w.rows * n_tokens).as_mut_ptr());
    let dst = SharedOut(out.as_mut_ptr());
    pool.run(n_chunks, &|c| {
        let first = c * chunk;
        let rows = chunk.min(w.rows - first);
        // SAFETY: chunk `c` owns rows `first .. first + rows` of `rows_by_token` (sized to
        // `w.rows · n_tokens` above), disjoint per chunk.
        let o = unsafe {
            std::slice::from_raw_parts_mut(by_row.ptr().add(first * n_tokens), rows * n_tokens)
        };
        let token_major = match few {
            Some((dot, pack, token_major)) => {
                let w_rows = &w.data[first * w.row_bytes..(first + rows) * w.row_bytes];
                dot(w.cols, w_rows, w.row_bytes, pack, n_tokens, o);
                token_major
            }
            None => {
                dot_rows(&kernels, &w, first, act, act_row_bytes, n_tokens, o);
                false
            }
        };
        for t in 0..n_tokens {
            // SAFETY: chunk `c` owns columns `first .. first + rows` of every token's row of
            // `out` (`n_tokens × w.rows`, checked above), disjoint per chunk; `out` outlives
            // `run`, which returns when every chunk is done.
            let out_row =
                unsafe { std::slice::from_raw_parts_mut(dst.ptr().add(t * w.rows + first), rows) };
            if token_major {
                out_row.copy_from_slice(&o[t * rows..(t + 1) * rows]);
            } else {
                for (r, v) in out_row.iter_mut().enumerate() {
                    *v = o[r * n_tokens + t];
                }
            }
        }
    });
    Ok(())
}

/// The whole panels of `w` against every token (activation rows and their side data
/// `act`, `aux`, each with its per-token bytes): chunks of panels over the pool, each
/// packed once and dotted against all tokens.
fn panel_matmul(
    pool: &impl ChunkRunner,
    p: PanelKernels,
    w: &Weight<'_>,
    (act, act_row_bytes): (&[u8], usize),
    (aux, aux_bytes): (&[u8], usize),
    n_tokens: usize,
    out: &mut [f32],
) {
    let n_panels = w.rows / p.rows;
    let panel_bytes = (p.panel_bytes)(w.cols);
    // A chunk's panels are all packed first, then walked by each token block, so both
    // stay in a core's L2 however long the prompt (the float panels' f32 activations
    // would not fit whole).
    let per_chunk = n_panels
        .div_ceil(pool.threads() * PANEL_CHUNKS_PER_THREAD)
        .clamp(1, (CHUNK_PANEL_BYTES / panel_bytes.max(1)).max(1));
    // A whole number of chunks per thread where the panels allow, so no thread is left
    // with one last chunk while the others wait (15 chunks of 10 panels on 2 threads → 16
    // of 9).
    let threads = pool.threads().max(1);
    let per_chunk = n_panels.div_ceil(n_panels.div_ceil(per_chunk).next_multiple_of(threads));
    let token_block =
        (TOKEN_TILE_BYTES / (act_row_bytes + aux_bytes).max(1)).max(p.tokens) / p.tokens * p.tokens;
    let token_block = token_block.min(n_tokens);
    let dst = SharedOut(out.as_mut_ptr());
    pool.run(n_panels.div_ceil(per_chunk), &|c| {
        PANEL.with(|cell| {
            let (panel_buf, tile_buf) = &mut *cell.borrow_mut();
            let (i0, i1) = (c * per_chunk, ((c + 1) * per_chunk).min(n_panels));
            let panels = aligned(panel_buf, (i1 - i0) * panel_bytes);
            for (i, panel) in (i0..i1).zip(panels.chunks_exact_mut(panel_bytes.max(1))) {
                let first = i * p.rows;
                let rows = &w.data[first * w.row_bytes..(first + p.rows) * w.row_bytes];
                (p.pack)(w.cols, rows, w.row_bytes, panel);
                if i + 1 < i1 {
                    // The next panel's rows stream in from memory while this one packs.
                    let next = first + p.rows;
                    prefetch(&w.data[next * w.row_bytes..(next + p.rows) * w.row_bytes]);
                }
            }
            let panels: &[u8] = panels;
            let tile = sized(tile_buf, token_block * p.rows);
            for t0 in (0..n_tokens).step_by(token_block) {
                let nt = token_block.min(n_tokens - t0);
                let (acts, auxs) = (&act[t0 * act_row_bytes..], &aux[t0 * aux_bytes..]);
                for (i, panel) in (i0..i1).zip(panels.chunks_exact(panel_bytes.max(1))) {
                    let first = i * p.rows;
                    let tile = &mut tile[..nt * p.rows];
                    (p.gemm)(w.cols, panel, acts, act_row_bytes, auxs, aux_bytes, tile);
                    for (t, lanes) in tile.chunks_exact(p.rows).enumerate() {
                        // SAFETY: panel `i` (of chunk `c`) owns columns `first .. first +
                        // rows` of every token's row of `out` (`n_tokens × w.rows`), disjoint
                        // per panel; `out` outlives `run`, which returns when every chunk is
                        // done.
                        let o = unsafe {
                            std::slice::from_raw_parts_mut(
                                dst.ptr().add((t0 + t) * w.rows + first),
                                p.rows,
                            )
                        };
                        put_lanes(o, lanes);
                    }
                }
            }
        })
    });
}

/// `o.copy_from_slice(lanes)` for a panel's rows, without a `memcpy` call for each token's
/// four to sixteen floats (slice copies of the matched lengths were merged back into one
/// call of the run-time length).
#[inline]
fn put_lanes(o: &mut [f32], lanes: &[f32]) {
    fn put<const N: usize>(o: &mut [f32], lanes: &[f32]) {
        let v: [f32; N] = core::array::from_fn(|i| lanes[i]);
        for (o, v) in o[..N].iter_mut().zip(v) {
            *o = v;
        }
    }
    assert_eq!(o.len(), lanes.len(), "panel results: row counts differ");
    match o.len() {
        4 => put::<4>(o, lanes),
        8 => put::<8>(o, lanes),
        16 => put::<16>(o, lanes),
        _ => o.copy_from_slice(lanes),
    }
}

/// `len` bytes of `buf` starting at a 64-byte (cache line) boundary: the float panels'
/// vector loads then never straddle two lines (which cost the AVX2 tile a quarter of its
/// speed, since a split load counts twice).
fn aligned(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    let b = sized(buf, len + 63);
    let skip = b.as_ptr().align_offset(64);
    &mut b[skip..skip + len]
}

/// Asks for `bytes` to be brought into the L2 cache ahead of their use.
#[inline]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        // SAFETY: a prefetch is only a hint and never faults; SSE is part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Dots weight rows `first_row ..` against every token's activation row; `out` is
/// `rows × n_tokens` (row-major by weight row) and its length says how many rows.
///
/// Walks row tiles of about [`ROW_TILE_BYTES`] and, inside each, token blocks of about
/// [`TOKEN_TILE_BYTES`], so both operands of the inner loops come from cache; uses the
/// two-row × eight- and four-token kernels, else the four-token kernel, where the level
/// has them (same bits as the `vec_dot` calls they replace).
pub fn dot_rows(
    kernels: &FormatKernels,
    w: &Weight<'_>,
    first_row: usize,
    act: &[u8],
    act_row_bytes: usize,
    n_tokens: usize,
    out: &mut [f32],
) {
    let rows = out.len() / n_tokens;
    if n_tokens == 1 {
        // Decoding: one pass over the rows, with nothing per row but the kernel call.
        let w_rows = &w.data[first_row * w.row_bytes..(first_row + rows) * w.row_bytes];
        for (o, w_row) in out.iter_mut().zip(w_rows.chunks_exact(w.row_bytes.max(1))) {
            *o = (kernels.vec_dot)(w.cols, w_row, act);
        }
        return;
    }
    let row_tile = (ROW_TILE_BYTES / w.row_bytes.max(1)).clamp(1, rows.max(1));
    // A whole number of eight- (or four-) token groups where it can be, so only the
    // prompt's last few tokens take the smaller kernels, not the end of every tile.
    let token_tile = match TOKEN_TILE_BYTES / act_row_bytes.max(1) {
        t if t >= 8 => t / 8 * 8,
        t if t >= 4 => t / 4 * 4,
        t => t.max(1),
    }
    .min(n_tokens);
    for r0 in (0..rows).step_by(row_tile) {
        let r1 = (r0 + row_tile).min(rows);
        for t0 in (0..n_tokens).step_by(token_tile) {
            let t1 = (t0 + token_tile).min(n_tokens);
            let acts = &act[t0 * act_row_bytes..t1 * act_row_bytes];
            let mut r = r0;
            if let Some(x2x4) = kernels.vec_dot_2x4 {
                // Two rows × four tokens per call: each token's activations are also loaded
                // once for both rows.
                while r + 2 <= r1 {
                    let w_rows = &w.data[(first_row + r) * w.row_bytes..];
                    let w_rows = &w_rows[..2 * w.row_bytes];
                    let n4 = (t1 - t0) / 4 * 4;
                    // Eight tokens per call where the level has it: weights unpacked once.
                    let n8 = kernels.vec_dot_2x8.map_or(0, |_| n4 / 8 * 8);
                    let mut put = |t: usize, d: [f32; 8]| {
                        let (o0, o1) = (r * n_tokens + t, (r + 1) * n_tokens + t);
                        out[o0..o0 + 4].copy_from_slice(&d[..4]);
                        out[o1..o1 + 4].copy_from_slice(&d[4..]);
                    };
                    if let Some(x2x8) = kernels.vec_dot_2x8 {
                        for (g, a) in acts[..n8 * act_row_bytes]
                            .chunks_exact(8 * act_row_bytes)
                            .enumerate()
                        {
                            let [d0, d1] = x2x8(w.cols, w_rows, w.row_bytes, a, act_row_bytes);
                            put(t0 + 8 * g, d0);
                            put(t0 + 8 * g + 4, d1);
                        }
                    }
                    for (g, a) in acts[n8 * act_row_bytes..n4 * act_row_bytes]
                        .chunks_exact(4 * act_row_bytes)
                        .enumerate()
                    {
                        put(
                            t0 + n8 + 4 * g,
                            x2x4(w.cols, w_rows, w.row_bytes, a, act_row_bytes),
                        );
                    }
                    for rr in r..r + 2 {
                        let w_row = w.row(first_row + rr);
                        let rest = acts[n4 * act_row_bytes..].chunks_exact(act_row_bytes);
                        let o = &mut out[rr * n_tokens + t0 + n4..rr * n_tokens + t1];
                        for (o, a) in o.iter_mut().zip(rest) {
                            *o = (kernels.vec_dot)(w.cols, w_row, a);
                        }
                    }
                    r += 2;
                }
            }
            for r in r..r1 {
                let w_row = w.row(first_row + r);
                let out_row = &mut out[r * n_tokens + t0..r * n_tokens + t1];
                let mut done = 0;
                if let Some(x4) = kernels.vec_dot_x4 {
                    // Four tokens per call: each weight block is unpacked once for all four.
                    for (o, a) in out_row
                        .chunks_exact_mut(4)
                        .zip(acts.chunks_exact(4 * act_row_bytes))
                    {
                        o.copy_from_slice(&x4(w.cols, w_row, a, act_row_bytes));
                        done += 4;
                    }
                }
                let rest = acts[done * act_row_bytes..].chunks_exact(act_row_bytes);
                for (o, a) in out_row[done..].iter_mut().zip(rest) {
                    *o = (kernels.vec_dot)(w.cols, w_row, a);
                }
            }
        }
    }
}
