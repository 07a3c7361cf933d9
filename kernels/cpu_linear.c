/* y = x W^T + b over a weight packed once at load: the CPU path's linear layers, with float32
 * activations and a float32, int8 or int4 weight.
 *
 * At the few rows of a decode step a linear layer is a stream of its weight, each value used
 * once per row. oneDNN (backend/models/cpu_linear.py's other path) read float32 weights at ~27 GB/s
 * on 16 rows here, where the machine streams ~41 GB/s. This kernel walks the weight once, in the
 * order it lies in memory:
 *
 * - the weight is packed as tiles of 16 output features, [N/16][K][16] (zero past N), so one
 *   load is one k for 16 outputs (64 bytes of float32, 16 of int8, 8 of int4);
 * - the rows of x are copied per call into blocks of 16 rows, [M/16][K][16], so the 16 values of
 *   one k share a cache line and each reaches its FMA as a broadcast (up to 8 rows are read where
 *   they lie instead: KVSERVE_LINEAR_DIRECT_ROWS);
 * - a tile's 16 outputs for 16 rows accumulate in 16 of AVX-512's 32 vector registers (under
 *   AVX2, 6 rows in 12 of its 16, three passes per block over codes widened once per chunk for
 *   the whole row group); further row blocks take further passes over the tile while it is still
 *   in L1/L2;
 * - more than 64 rows (prefill) sweep the weight once per 64 rows, so that those rows' blocks
 *   stay in L2 across tiles (oneDNN is 1.04-1.08x faster at 256-1,024 float32 rows on a Zen 4,
 *   but float32 prefill runs here all the same, so that the weights are held once:
 *   backend/models/cpu_linear.py; torch's int8 and int4 kernels are slower than this one at
 *   every size);
 * - the weight is prefetched 32 KB ahead (float32 into L2, codes into L1): with the hardware
 *   prefetcher alone the loop waited on memory, and 16-row steps ran no faster than oneDNN's;
 * - int8 codes are widened to float32 in registers and the sums scaled per output; int4 codes
 *   become (q - 8) * scale + zero with one scale and zero per output and group of 32 inputs (the
 *   tinygemm convention of backend/models/quantize.py).
 *
 * The vector code is cpu_vec16.h's 16 lanes: one AVX-512 register, or two AVX2 ones doing the
 * same per-lane operations (each lane one output, its FMAs over k in order), so both give the same
 * results bit for bit. Threads split the tiles. Without AVX-512 or AVX2 + FMA + F16C the entry
 * points return nonzero and the callers keep oneDNN or torch's kernels. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KVSERVE_LINEAR_TILE 16 /* output features per tile: one vector */
#define KVSERVE_LINEAR_ROWS 16 /* rows per pass: 16 accumulators */
#define KVSERVE_LINEAR_PREFETCH_BYTES (32 * 1024) /* how far ahead the weight is asked for */
#define KVSERVE_LINEAR_GROUP 4 /* row blocks per sweep of the weight: 64 rows */
#define KVSERVE_LINEAR_I4_GROUP 32 /* inputs per int4 scale and zero (GGUF's Q4 block size) */

/* Weight formats (compile-time in each pass): float32; int8 codes with one scale per output;
 * int4 codes, two per byte, with a scale and a zero per output and group of 32 inputs; and the
 * grid codes of float32 weights (backend/models/grid_weights.py): 4-bit ones whose value is
 * q * d + m, 8-bit ones q * d, with d (and m) per output and group of 32 inputs. */
enum { W_F32 = 0, W_I8 = 1, W_I4 = 2, W_G4 = 3, W_G8 = 4, W_G8H = 5 };
#define KVSERVE_LINEAR_HALF_GROUP 16 /* inputs per d and m of W_G8H: 8-bit codes q * d + m (Q6_K's sub-block) */

#include "cpu_vec16.h"

#if defined(KVSERVE_VEC16)
/* Rows one tile_pass keeps in registers: 16 accumulators under AVX-512, 6 under AVX2 (each a pair
 * of its 16 registers: with the weight vector and a broadcast they take 15, and the group scale and
 * zero, read once per 32 inputs, live in memory; `linear_ab.py --grid` on SmolLM2's projections:
 * 36.3 against 4 rows a pass's 47.2 ms at 6 rows, 57.4 against 67.2 at 9, 96.0 against 101.8 at 16). A
 * block of 16 rows takes 16 / KVSERVE_LINEAR_PASS_ROWS passes over a tile; each row's sums are the
 * same operations in the same order either way. */
#define KVSERVE_LINEAR_PASS_ROWS (KVSERVE_V16_REGS == 8 ? 6 : KVSERVE_V16_REGS / 2)

/* A tile's 16 weights at input k as float32: the codes widened and, for the grouped formats, given
 * their group's step and offset (`group_scale`, `group_zero`: reloaded at each group's first k).
 * The one definition of every format's values: the passes below and the widened chunks use it. */
static inline __attribute__((always_inline)) v16 tile_weights_at(const int WT, const void *w, int64_t k,
                                                                 const float *scales, const float *zeros,
                                                                 v16 *group_scale, v16 *group_zero) {
    if (WT == W_I4 || WT == W_G4 || WT == W_G8 || WT == W_G8H) {
        const int64_t group = WT == W_G8H ? KVSERVE_LINEAR_HALF_GROUP : KVSERVE_LINEAR_I4_GROUP;
        if ((k & (group - 1)) == 0) {
            const int64_t g = k / group;
            *group_scale = v16_load(scales + g * KVSERVE_LINEAR_TILE);
            if (WT != W_G8) *group_zero = v16_load(zeros + g * KVSERVE_LINEAR_TILE);
        }
    }
    if (WT == W_I4 || WT == W_G4) {
        const uint8_t *wk = (const uint8_t *)w + k * (KVSERVE_LINEAR_TILE / 2);
        _mm_prefetch((const char *)(wk + KVSERVE_LINEAR_PREFETCH_BYTES), _MM_HINT_T0); /* never faults */
        const v16 q = v16_from_u4(wk); /* byte j: outputs 2j (low nibble), 2j + 1 (high) */
        /* int4: (q - 8) * scale, exact, plus zero in one rounding. Grid: q * d + m in one rounding,
         * which is q * d then + m since grid_weights.py keeps only steps d that make q * d exact. */
        return v16_fma(WT == W_I4 ? v16_sub(q, v16_set1(8.0f)) : q, *group_scale, *group_zero);
    }
    if (WT == W_I8 || WT == W_G8 || WT == W_G8H) {
        const int8_t *wk = (const int8_t *)w + k * KVSERVE_LINEAR_TILE;
        _mm_prefetch((const char *)(wk + KVSERVE_LINEAR_PREFETCH_BYTES), _MM_HINT_T0);
        v16 wv = v16_from_i8(wk);
        if (WT == W_G8) wv = v16_mul(wv, *group_scale); /* q * d, one rounding as numpy's */
        if (WT == W_G8H) wv = v16_fma(wv, *group_scale, *group_zero); /* one rounding (gguf_codes.py) */
        return wv;
    }
    const float *wk = (const float *)w + k * KVSERVE_LINEAR_TILE;
    /* float32 is asked for into L2, not L1: each line is used once per pass and the loads come soon
     * after, and on a Zen 4 the L1 hint ran one step's projections 1.15x slower at one row and 1.3x
     * at 8 (`linear_ab.py --grid`: 21.3 against 18.8 ms, 22.9 against 17.7). The codes keep the L1
     * hint: the grid tiles measured level, and the strips (cpu_grid_linear.c) lost with L2. */
    _mm_prefetch((const char *)wk + KVSERVE_LINEAR_PREFETCH_BYTES, _MM_HINT_T1);
    return v16_load(wk);
}

/* One pass: ROWS rows of x times a weight tile ([K][16] values): the rows of an x block ([K][16], from
 * row `xb`'s column on), or (DIRECT) the rows of x where they lie, x_stride apart. For int8 the tile's
 * 16 output scales multiply the sums; int4 values are (q - 8) * scale + zero, per group. Outputs
 * [0, width) of each row are stored. */
static inline __attribute__((always_inline)) void tile_pass(const int ROWS, const int WT, const int DIRECT,
                                                            const float *xb, int64_t x_stride, const void *w,
                                                            int64_t k_len, const float *scales,
                                                            const float *zeros, const float *bias, float *out,
                                                            int64_t out_stride, int width) {
    v16 acc[KVSERVE_LINEAR_PASS_ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = v16_zero();
    v16 group_scale = v16_zero(), group_zero = v16_zero();
    for (int64_t k = 0; k < k_len; k++) {
        const v16 wv = tile_weights_at(WT, w, k, scales, zeros, &group_scale, &group_zero);
        const float *xk = DIRECT ? xb + k : xb + k * KVSERVE_LINEAR_ROWS;
        for (int r = 0; r < ROWS; r++) acc[r] = v16_fma(v16_set1(xk[DIRECT ? r * x_stride : r]), wv, acc[r]);
    }
    const v16 scale = WT == W_I8 ? v16_load_first(scales, width) : v16_set1(1.0f);
    const v16 b = bias ? v16_load_first(bias, width) : v16_zero();
    for (int r = 0; r < ROWS; r++) v16_store_first(out + r * out_stride, width, v16_fma(acc[r], scale, b));
}

#define KVSERVE_TILE_PASS(n, DIRECT)                                                                           \
    do {                                                                                                       \
        if (wt == W_I4)                                                                                        \
            tile_pass(n, W_I4, DIRECT, xb, x_stride, w, k_len, scales, zeros, bias, out, out_stride, width);    \
        else if (wt == W_G4)                                                                                   \
            tile_pass(n, W_G4, DIRECT, xb, x_stride, w, k_len, scales, zeros, bias, out, out_stride, width);    \
        else if (wt == W_G8)                                                                                   \
            tile_pass(n, W_G8, DIRECT, xb, x_stride, w, k_len, scales, zeros, bias, out, out_stride, width);    \
        else if (wt == W_G8H)                                                                                  \
            tile_pass(n, W_G8H, DIRECT, xb, x_stride, w, k_len, scales, zeros, bias, out, out_stride, width);   \
        else if (wt == W_I8)                                                                                   \
            tile_pass(n, W_I8, DIRECT, xb, x_stride, w, k_len, scales, zeros, bias, out, out_stride, width);    \
        else                                                                                                   \
            tile_pass(n, W_F32, DIRECT, xb, x_stride, w, k_len, scales, zeros, bias, out, out_stride, width);   \
    } while (0)
#define KVSERVE_TILE_CASE(n) \
    case n: KVSERVE_TILE_PASS(n, 0); break;
#define KVSERVE_DIRECT_CASE(n) \
    case n: KVSERVE_TILE_PASS(n, 1); break;

/* At most this many rows read x where it lies (tile_pass's DIRECT), and more are first copied into
 * blocks where a k's 16 values share a cache line. In place, each k reads one value from each row's
 * line: cheaper than the copy at a few rows, dearer with a line per row for many (one step's
 * projections on SmolLM2's grid codes, in place / copied: 0.94x at 5 rows, 0.96x at 8, 1.03x at 10,
 * 1.01x at 16; the native decode step at 5 rows 0.91x, at 8 0.99x). AVX-512 only: AVX2's widened
 * chunks read the blocks. The copy stays on the calling thread: split between the threads it made
 * the 16-row native step 1.03x slower, each thread then reading rows the other had just written. */
#define KVSERVE_LINEAR_DIRECT_ROWS (KVSERVE_LINEAR_PASS_ROWS >= 8 ? 8 : 0)

#if KVSERVE_LINEAR_PASS_ROWS < KVSERVE_LINEAR_ROWS
/* Under AVX2 more rows than a pass holds take several passes over a tile, and each pass would widen
 * the codes again: per k, the nibbles' unpacking and conversion and a group's FMA, as many
 * instructions as two rows' FMAs, on cores where the FMAs are the bound (one 256-bit FMA a cycle on
 * these EPYCs). So there the tile's values are widened once per chunk of inputs into float32 (8 KB,
 * in L1) and every pass of a row group (up to 64 rows) runs over the chunk, its rows' sums kept in
 * memory between chunks. Each row's sums are the same FMAs in the same order as tile_pass's: the
 * same bits. */
#define KVSERVE_LINEAR_WIDE_CHUNK 128 /* inputs per widened chunk: a multiple of every group */
_Static_assert(KVSERVE_LINEAR_PASS_ROWS == 6, "tile_group_widened's cases are AVX2's six rows a pass");

static inline __attribute__((always_inline)) void widen_format(const int WT, const void *w, int64_t k0,
                                                               int64_t k_len, const float *scales, const float *zeros,
                                                               v16 *group_scale, v16 *group_zero, float *wide) {
    for (int64_t k = 0; k < k_len; k++)
        v16_store(wide + k * KVSERVE_LINEAR_TILE, tile_weights_at(WT, w, k0 + k, scales, zeros, group_scale, group_zero));
}

static void widen_chunk(int wt, const void *w, int64_t k0, int64_t k_len, const float *scales, const float *zeros,
                        v16 *group_scale, v16 *group_zero, float *wide) {
    switch (wt) {
        case W_I4: widen_format(W_I4, w, k0, k_len, scales, zeros, group_scale, group_zero, wide); break;
        case W_G4: widen_format(W_G4, w, k0, k_len, scales, zeros, group_scale, group_zero, wide); break;
        case W_G8: widen_format(W_G8, w, k0, k_len, scales, zeros, group_scale, group_zero, wide); break;
        case W_G8H: widen_format(W_G8H, w, k0, k_len, scales, zeros, group_scale, group_zero, wide); break;
        default: widen_format(W_I8, w, k0, k_len, scales, zeros, group_scale, group_zero, wide); break;
    }
}

/* ROWS rows' sums (`acc`, in memory) carried over a widened chunk of k_len inputs. */
static inline __attribute__((always_inline)) void chunk_pass(const int ROWS, const float *xb, const float *wide,
                                                             int64_t k_len, v16 *acc) {
    v16 sums[KVSERVE_LINEAR_PASS_ROWS];
    for (int r = 0; r < ROWS; r++) sums[r] = acc[r];
    for (int64_t k = 0; k < k_len; k++) {
        const v16 wv = v16_load(wide + k * KVSERVE_LINEAR_TILE);
        const float *xk = xb + k * KVSERVE_LINEAR_ROWS;
        for (int r = 0; r < ROWS; r++) sums[r] = v16_fma(v16_set1(xk[r]), wv, sums[r]);
    }
    for (int r = 0; r < ROWS; r++) acc[r] = sums[r];
}

#define KVSERVE_CHUNK_CASE(n) \
    case n: chunk_pass(n, xb, wide, len, acc + r0); break;

/* The `rows` of a group of x blocks (`blocks`, block_len apart: more rows than one pass holds) over a
 * tile of codes (not float32), widened chunk by chunk once for the whole group: at 64 rows one
 * widening serves 4 blocks' 11 passes where widening per block took 4. Each pass stays inside its
 * block (a block is 16 rows, passes of 6: rows 0-5, 6-11, 12-15), so every row's sums are tile_pass's
 * FMAs in tile_pass's order, as before. */
static void tile_group_widened(int64_t rows, int wt, const float *blocks, int64_t block_len, const void *w,
                               int64_t k_len, const float *scales, const float *zeros, const float *bias,
                               float *out, int64_t out_stride, int width) {
    float wide[KVSERVE_LINEAR_WIDE_CHUNK * KVSERVE_LINEAR_TILE] __attribute__((aligned(64)));
    v16 acc[KVSERVE_LINEAR_ROWS * KVSERVE_LINEAR_GROUP];
    for (int64_t r = 0; r < rows; r++) acc[r] = v16_zero();
    v16 group_scale = v16_zero(), group_zero = v16_zero();
    for (int64_t k0 = 0; k0 < k_len; k0 += KVSERVE_LINEAR_WIDE_CHUNK) {
        const int64_t len = k_len - k0 < KVSERVE_LINEAR_WIDE_CHUNK ? k_len - k0 : KVSERVE_LINEAR_WIDE_CHUNK;
        widen_chunk(wt, w, k0, len, scales, zeros, &group_scale, &group_zero, wide);
        for (int64_t b0 = 0; b0 < rows; b0 += KVSERVE_LINEAR_ROWS) {
            const int64_t block_rows = rows - b0 < KVSERVE_LINEAR_ROWS ? rows - b0 : KVSERVE_LINEAR_ROWS;
            for (int64_t p = 0; p < block_rows; p += KVSERVE_LINEAR_PASS_ROWS) {
                const int64_t r0 = b0 + p; /* acc's index of the pass's first row */
                const float *xb = blocks + (b0 / KVSERVE_LINEAR_ROWS) * block_len + k0 * KVSERVE_LINEAR_ROWS + p;
                switch (block_rows - p < KVSERVE_LINEAR_PASS_ROWS ? block_rows - p : KVSERVE_LINEAR_PASS_ROWS) {
                    KVSERVE_CHUNK_CASE(1) KVSERVE_CHUNK_CASE(2) KVSERVE_CHUNK_CASE(3)
                    KVSERVE_CHUNK_CASE(4) KVSERVE_CHUNK_CASE(5) KVSERVE_CHUNK_CASE(6)
                    default: break;
                }
            }
        }
    }
    const v16 scale = wt == W_I8 ? v16_load_first(scales, width) : v16_set1(1.0f);
    const v16 b = bias ? v16_load_first(bias, width) : v16_zero();
    for (int64_t r = 0; r < rows; r++) v16_store_first(out + r * out_stride, width, v16_fma(acc[r], scale, b));
}
#endif

/* Row counts (and the weight format) as compile-time constants, so that the accumulators stay in
 * registers: a block's `rows` in passes of up to KVSERVE_LINEAR_PASS_ROWS. x_stride > 0: the rows
 * are x's own, that far apart (at most KVSERVE_LINEAR_DIRECT_ROWS of them); 0: an x block's. */
static void tile_rows(int rows, int wt, const float *block, int64_t x_stride, const void *w, int64_t k_len,
                      const float *scales, const float *zeros, const float *bias, float *block_out,
                      int64_t out_stride, int width) {
#if KVSERVE_LINEAR_DIRECT_ROWS
    if (x_stride) {
        const float *xb = block;
        float *out = block_out;
        switch (rows) {
            KVSERVE_DIRECT_CASE(1) KVSERVE_DIRECT_CASE(2) KVSERVE_DIRECT_CASE(3) KVSERVE_DIRECT_CASE(4)
            KVSERVE_DIRECT_CASE(5) KVSERVE_DIRECT_CASE(6) KVSERVE_DIRECT_CASE(7) KVSERVE_DIRECT_CASE(8)
            default: break;
        }
        return;
    }
#endif
    for (int r0 = 0; r0 < rows; r0 += KVSERVE_LINEAR_PASS_ROWS) {
        const float *xb = block + r0; /* the pass's first row's column of the block */
        float *out = block_out + r0 * out_stride;
        switch (rows - r0 < KVSERVE_LINEAR_PASS_ROWS ? rows - r0 : KVSERVE_LINEAR_PASS_ROWS) {
            KVSERVE_TILE_CASE(1) KVSERVE_TILE_CASE(2) KVSERVE_TILE_CASE(3) KVSERVE_TILE_CASE(4)
#if KVSERVE_LINEAR_PASS_ROWS > 4
            KVSERVE_TILE_CASE(5) KVSERVE_TILE_CASE(6)
#endif
#if KVSERVE_LINEAR_PASS_ROWS > 6
            KVSERVE_TILE_CASE(7) KVSERVE_TILE_CASE(8)
            KVSERVE_TILE_CASE(9) KVSERVE_TILE_CASE(10) KVSERVE_TILE_CASE(11) KVSERVE_TILE_CASE(12)
            KVSERVE_TILE_CASE(13) KVSERVE_TILE_CASE(14) KVSERVE_TILE_CASE(15) KVSERVE_TILE_CASE(16)
#endif
            default: break;
        }
    }
}

#endif

/* The entry points' common body: nonzero when this build cannot run it (no vector path, or no memory). */
static int linear(const float *x, int64_t x_stride, int64_t m, int64_t k, const void *packed, int wt,
                  const float *scales, const float *zeros, int64_t n, const float *bias, float *out,
                  int64_t out_stride, int num_threads) {
#if defined(KVSERVE_VEC16)
    const int64_t blocks = (m + KVSERVE_LINEAR_ROWS - 1) / KVSERVE_LINEAR_ROWS;
    const int64_t block_len = k * KVSERVE_LINEAR_ROWS;
    const int direct = m <= KVSERVE_LINEAR_DIRECT_ROWS; /* one block, read in place */
    float *xb = direct ? NULL : malloc(sizeof(float) * (size_t)(blocks * block_len));
    if (!direct && !xb) return 2;
    const int64_t tiles = (n + KVSERVE_LINEAR_TILE - 1) / KVSERVE_LINEAR_TILE;
    const int grouped = wt == W_I4 || wt == W_G4 || wt == W_G8 || wt == W_G8H; /* scales per group of inputs */
    const size_t tile_bytes = wt == W_I4 || wt == W_G4 ? (size_t)(k * KVSERVE_LINEAR_TILE / 2)
                              : wt == W_F32           ? (size_t)(k * KVSERVE_LINEAR_TILE) * sizeof(float)
                                                      : (size_t)(k * KVSERVE_LINEAR_TILE);
    const int64_t group_len = k / (wt == W_G8H ? KVSERVE_LINEAR_HALF_GROUP : KVSERVE_LINEAR_I4_GROUP)
                              * KVSERVE_LINEAR_TILE; /* a tile's group scales */
    if (!direct)
        for (int64_t row = 0; row < m; row++) {
            float *dst = xb + (row / KVSERVE_LINEAR_ROWS) * block_len + row % KVSERVE_LINEAR_ROWS;
            for (int64_t kk = 0; kk < k; kk++) dst[kk * KVSERVE_LINEAR_ROWS] = x[row * x_stride + kk];
        }
#pragma omp parallel num_threads(num_threads)
    for (int64_t g0 = 0; g0 < blocks; g0 += KVSERVE_LINEAR_GROUP) {
        const int64_t g1 = g0 + KVSERVE_LINEAR_GROUP < blocks ? g0 + KVSERVE_LINEAR_GROUP : blocks;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t col = t * KVSERVE_LINEAR_TILE;
            const int64_t width = n - col < KVSERVE_LINEAR_TILE ? n - col : KVSERVE_LINEAR_TILE;
            const void *w = (const char *)packed + (size_t)t * tile_bytes;
            const float *tile_scales = wt == W_I8 ? scales + col : grouped ? scales + t * group_len : NULL;
            const float *tile_zeros = zeros ? zeros + t * group_len : NULL;
#if KVSERVE_LINEAR_PASS_ROWS < KVSERVE_LINEAR_ROWS /* AVX2: the group's rows widen each chunk once */
            const int64_t group_rows = (m < g1 * KVSERVE_LINEAR_ROWS ? m : g1 * KVSERVE_LINEAR_ROWS)
                                       - g0 * KVSERVE_LINEAR_ROWS;
            if (wt != W_F32 && group_rows > KVSERVE_LINEAR_PASS_ROWS) {
                tile_group_widened(group_rows, wt, xb + g0 * block_len, block_len, w, k, tile_scales, tile_zeros,
                                   bias ? bias + col : NULL, out + g0 * KVSERVE_LINEAR_ROWS * out_stride + col,
                                   out_stride, (int)width);
                continue;
            }
#endif
            for (int64_t b = g0; b < g1; b++) {
                const int64_t r0 = b * KVSERVE_LINEAR_ROWS;
                const int rows = m - r0 < KVSERVE_LINEAR_ROWS ? (int)(m - r0) : KVSERVE_LINEAR_ROWS;
                tile_rows(rows, wt, direct ? x + r0 * x_stride : xb + b * block_len, direct ? x_stride : 0, w, k,
                          tile_scales, tile_zeros, bias ? bias + col : NULL, out + r0 * out_stride + col,
                          out_stride, (int)width);
            }
        }
    }
    free(xb);
    return 0;
#else
    (void)x; (void)x_stride; (void)m; (void)k; (void)packed; (void)wt; (void)scales; (void)zeros; (void)n;
    (void)bias; (void)out; (void)out_stride; (void)num_threads;
    return 1;
#endif
}

/* weight [n][k] of `elem`-byte values -> packed [ceil(n/16)][k][16], zero past n. Inlined into each
 * caller, so that every copy is of a constant size. */
static inline __attribute__((always_inline)) void pack_tiles(const char *weight, size_t elem, int64_t n, int64_t k,
                                                             char *packed) {
    const int64_t tiles = (n + KVSERVE_LINEAR_TILE - 1) / KVSERVE_LINEAR_TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++)
        for (int64_t kk = 0; kk < k; kk++)
            for (int j = 0; j < KVSERVE_LINEAR_TILE; j++) {
                const int64_t row = t * KVSERVE_LINEAR_TILE + j;
                char *to = packed + (size_t)((t * k + kk) * KVSERVE_LINEAR_TILE + j) * elem;
                if (row < n)
                    memcpy(to, weight + (size_t)(row * k + kk) * elem, elem);
                else
                    memset(to, 0, elem);
            }
}

void kvserve_pack_linear_f32(const float *weight, int64_t n, int64_t k, float *packed) {
    pack_tiles((const char *)weight, sizeof(float), n, k, (char *)packed);
}

/* int8 codes, in the same layout. */
void kvserve_pack_linear_i8(const int8_t *weight, int64_t n, int64_t k, int8_t *packed) {
    pack_tiles((const char *)weight, sizeof(int8_t), n, k, (char *)packed);
}

/* out [m][n] (row stride out_stride) = x [m][k] (row stride x_stride) times the packed weight, plus
 * bias [n] when given. Returns nonzero when this build cannot run it (neither AVX-512 nor AVX2 + FMA +
 * F16C, or no memory). */
int kvserve_linear_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const float *packed, int64_t n,
                       const float *bias, float *out, int64_t out_stride, int num_threads) {
    return linear(x, x_stride, m, k, packed, W_F32, NULL, NULL, n, bias, out, out_stride, num_threads);
}

/* The same over packed int8 codes with one float32 scale per output: out = (x codes^T) * scale + bias.
 * Activations stay float32 (torch's int8 kernel needs them in bfloat16 to be fast). */
int kvserve_linear_i8_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const int8_t *packed,
                          const float *scales, int64_t n, const float *bias, float *out, int64_t out_stride,
                          int num_threads) {
    return linear(x, x_stride, m, k, packed, W_I8, scales, NULL, n, bias, out, out_stride, num_threads);
}

/* int4 codes q [n][k] (0..15, int32) -> packed [ceil(n/16)][k][8 bytes] (byte j of a k: outputs 2j
 * in the low nibble, 2j + 1 in the high one), zero past n (those outputs compute 0 and are never
 * stored). Their scales and zeros go tile-major, [ceil(n/16)][k/32][16] (kernels/cpu_native.py). */
void kvserve_pack_linear_i4(const int32_t *codes, int64_t n, int64_t k, uint8_t *packed) {
    const int64_t tiles = (n + KVSERVE_LINEAR_TILE - 1) / KVSERVE_LINEAR_TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        uint8_t *dst = packed + t * k * (KVSERVE_LINEAR_TILE / 2);
        for (int64_t kk = 0; kk < k; kk++)
            for (int j = 0; j < KVSERVE_LINEAR_TILE; j += 2) {
                const int64_t row = t * KVSERVE_LINEAR_TILE + j;
                const int lo = row < n ? codes[row * k + kk] & 0x0F : 0;
                const int hi = row + 1 < n ? codes[(row + 1) * k + kk] & 0x0F : 0;
                dst[kk * (KVSERVE_LINEAR_TILE / 2) + j / 2] = (uint8_t)(lo | (hi << 4));
            }
    }
}

/* The same over codes with scales (and zeros) per group of 32 inputs, tile-major (k a multiple of
 * 32), `format` one of:
 * - W_I4 (2): int4 codes packed by kvserve_pack_linear_i4, value (q - 8) * scale + zero;
 * - W_G4 (3): 4-bit grid codes of float32 weights, the same packing, value q * d + m;
 * - W_G8 (4): 8-bit grid codes packed by kvserve_pack_linear_i8, value q * d (zeros NULL);
 * - W_G8H (5): the same codes, value q * d + m with d and m per group of 16 inputs.
 * The grid formats' weights are the float32 ones exactly, so their results are the float32
 * kernel's bit for bit. Activations stay float32. Returns 3 for another format or width. */
int kvserve_linear_grouped_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const void *packed,
                               int format, const float *scales, const float *zeros, int64_t n, const float *bias,
                               float *out, int64_t out_stride, int num_threads) {
    if (k % KVSERVE_LINEAR_I4_GROUP || (format != W_I4 && format != W_G4 && format != W_G8 && format != W_G8H)
            || (format != W_G8 && !zeros))
        return 3;
    return linear(x, x_stride, m, k, packed, format, scales, format == W_G8 ? NULL : zeros, n, bias, out,
                  out_stride, num_threads);
}
