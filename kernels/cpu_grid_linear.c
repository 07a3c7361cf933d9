/* y = x W^T + b for a few rows, over a float32 weight kept as the codes of the block grid its
 * values lie on: the same float32 weights, read in a fifth of the bytes.
 *
 * A GGUF checkpoint's weights are codes and block constants: Q4_1 blocks of 32 inputs hold
 * d * q + m (q in 0..15), Q8_0 blocks d * q (q in -127..127). Dequantized, they are float32
 * values on that grid, and a decode step at one row is a stream of 4 bytes per value where half
 * a byte (plus the constants) says exactly the same. backend/models/grid_weights.py finds the
 * grid of a float32 weight (checking every value reproduces bit for bit); this kernel expands
 * the codes in registers and multiplies with the float32 activations, so the weights a product
 * uses are the float32 ones exactly and only the summation order differs (as between any two
 * BLAS libraries).
 *
 * - 4-bit codes: one 16-entry table per output and block, d * [0..15] + m, built with an FMA
 *   (exact: grid_weights.py keeps only steps d whose products with 0..15 are exact in float32,
 *   so one rounding of d * q + m is numpy's two), then one permute per 16 values;
 * - 8-bit codes: widened to float32 and multiplied by d (one rounding, as numpy's);
 * - the weight is laid out in strips of 4 outputs, block by block: [N/4][K/32] of 4 outputs'
 *   codes then their constants, so a step reads one stream in memory order, prefetched ahead;
 * - each (output, row) sums in one vector, reduced at the end of the strip.
 *
 * It suits few rows: the codes are expanded once per pass of 4 rows (AVX-512; under AVX2 one row
 * a pass, or 2-6 rows with the strip's outputs in turn), and past one call's rows
 * (kvserve_grid_strip_rows: 4, or 6 under AVX2) cpu_linear.c's tiles over the same codes are
 * faster (backend/models/cpu_linear.py switches there). A row's sums are the same whatever rows
 * run beside it. Threads split the strips. The vectors are cpu_vec16.h's (AVX-512, or AVX2 + FMA
 * + F16C with the same sums in the same order); without either the entry point returns nonzero
 * and the caller keeps its other path. */
#include <stdint.h>

#define KVSERVE_GRID_GROUP 32 /* inputs per block: GGUF's Q4_1 and Q8_0 block size */
#define KVSERVE_GRID_OUTS 4 /* outputs per strip: one 64-byte line of 4-bit codes per block */
#define KVSERVE_GRID_PREFETCH_BYTES (16 * 1024)

/* Code formats: 4-bit affine (d * q + m), 8-bit symmetric (d * q), 8-bit affine with d and m per
 * half block of 16 inputs (Q5_1's, Q5_K's and Q6_K's codes, backend/models/gguf_codes.py), and
 * `--quantization int4`'s codes ((q - 8) * d + m, d and m its scale and zero: the value
 * cpu_linear.c's int4 tiles compute, so the strips serve that mode's few-row steps too). */
enum { GRID_I4 = 2, GRID_Q4 = 4, GRID_Q8 = 8, GRID_Q8_HALVES = 16 };
/* Codes multiplied with activations quantized to int8 (cpu_grid_int8_dot.c, which has their
 * layouts): GRID_I4's with bfloat16 constants, GRID_Q4's with float16 ones, GRID_Q4's, GRID_Q8's and
 * GRID_Q8_HALVES's as they are. */
enum { GRID_I4_Q8 = 3, GRID_Q4_Q8 = 5, GRID_Q4H_Q8 = 6, GRID_Q8_Q8 = 9, GRID_Q8H_Q8 = 17 };
int kvserve_grid_int8_dot_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const uint8_t *packed,
                              int format, int64_t n, const float *bias, float *out, int64_t out_stride,
                              int num_threads);

/* Bytes of one strip's block: the 4 outputs' codes, then d for each (and m for each, 4-bit; for
 * halves d of the first 16 inputs, d of the last 16, then m likewise). */
static inline int64_t block_bytes(int bits) {
    return bits == GRID_Q4 || bits == GRID_I4 ? KVSERVE_GRID_OUTS * 16 + KVSERVE_GRID_OUTS * 8
           : bits == GRID_Q8 ? KVSERVE_GRID_OUTS * 32 + KVSERVE_GRID_OUTS * 4
                             : KVSERVE_GRID_OUTS * 32 + KVSERVE_GRID_OUTS * 16;
}

#include "cpu_vec16.h"

#if defined(KVSERVE_VEC16)
/* Rows per pass that keep the 4 outputs' accumulators in registers: 4 under AVX-512 (16 of its 32),
 * 1 under AVX2 (4 pairs of its 16). */
#define KVSERVE_GRID_PASS_ROWS (KVSERVE_V16_REGS / (2 * KVSERVE_GRID_OUTS))

/* Output o's 32 weights of one block as float32 (w_lo: inputs 0-15, w_hi: 16-31), from the codes. */
static inline __attribute__((always_inline)) void block_weights(const int BITS, const uint8_t *blk, int o, v16 *w_lo,
                                                                v16 *w_hi) {
    const int nibbles = BITS == GRID_Q4 || BITS == GRID_I4;
    const float *d = (const float *)(blk + KVSERVE_GRID_OUTS * (nibbles ? 16 : 32));
    if (nibbles) {
        /* byte j of a block: value j in the low nibble, value j + 16 in the high one. */
        const v16i codes = v16i_from_u8(blk + o * 16);
#if defined(__AVX512F__)
        /* One permute a vector from a table of the 16 values; it reads an index's low 4 bits. */
        const float iota_values[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        const float int4_values[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7}; /* q - 8 */
        const v16 q = v16_load(BITS == GRID_I4 ? int4_values : iota_values);
        const v16 table = v16_fma(v16_set1(d[o]), q, v16_set1(d[KVSERVE_GRID_OUTS + o]));
        *w_lo = v16_lookup(codes, table);
        *w_hi = v16_lookup(v16i_shr4(codes), table);
#else
        /* AVX2, where a lookup is five instructions a half: q * d + m (int4: (q - 8) * d + m) by
         * one FMA, the same rounding of the same product as the table's entry q. */
        const v16 dv = v16_set1(d[o]), mv = v16_set1(d[KVSERVE_GRID_OUTS + o]);
        v16 q_lo = v16_from_v16i(v16i_low4(codes)), q_hi = v16_from_v16i(v16i_shr4(codes));
        if (BITS == GRID_I4) {
            q_lo = v16_sub(q_lo, v16_set1(8.0f));
            q_hi = v16_sub(q_hi, v16_set1(8.0f));
        }
        *w_lo = v16_fma(q_lo, dv, mv);
        *w_hi = v16_fma(q_hi, dv, mv);
#endif
    } else if (BITS == GRID_Q8_HALVES) {
        /* d * q + m in one rounding: gguf_codes.py keeps codes only where that is numpy's value. */
        const int8_t *codes = (const int8_t *)(blk + o * 32);
        *w_lo = v16_fma(v16_from_i8(codes), v16_set1(d[o]), v16_set1(d[2 * KVSERVE_GRID_OUTS + o]));
        *w_hi = v16_fma(v16_from_i8(codes + 16), v16_set1(d[KVSERVE_GRID_OUTS + o]),
                        v16_set1(d[3 * KVSERVE_GRID_OUTS + o]));
    } else {
        const v16 scale = v16_set1(d[o]);
        const int8_t *codes = (const int8_t *)(blk + o * 32);
        *w_lo = v16_mul(v16_from_i8(codes), scale);
        *w_hi = v16_mul(v16_from_i8(codes + 16), scale);
    }
}

/* ROWS rows times one strip of 4 outputs; results at out[r * out_stride + o] for the `width`
 * outputs that exist. */
static inline __attribute__((always_inline)) void strip_pass(const int ROWS, const int BITS, const float *x,
                                                             int64_t x_stride, int64_t k, const uint8_t *strip,
                                                             const float *bias, float *out, int64_t out_stride,
                                                             int width) {
    v16 acc[KVSERVE_GRID_OUTS][KVSERVE_GRID_PASS_ROWS];
    for (int o = 0; o < KVSERVE_GRID_OUTS; o++)
        for (int r = 0; r < ROWS; r++) acc[o][r] = v16_zero();
    const int64_t step = block_bytes(BITS);
    const int64_t blocks = k / KVSERVE_GRID_GROUP;
    for (int64_t g = 0; g < blocks; g++) {
        const uint8_t *blk = strip + g * step;
        _mm_prefetch((const char *)blk + KVSERVE_GRID_PREFETCH_BYTES, _MM_HINT_T0); /* never faults */
        _mm_prefetch((const char *)blk + KVSERVE_GRID_PREFETCH_BYTES + 64, _MM_HINT_T0);
        v16 x_lo[KVSERVE_GRID_PASS_ROWS], x_hi[KVSERVE_GRID_PASS_ROWS];
        for (int r = 0; r < ROWS; r++) {
            x_lo[r] = v16_load(x + r * x_stride + g * KVSERVE_GRID_GROUP);
            x_hi[r] = v16_load(x + r * x_stride + g * KVSERVE_GRID_GROUP + 16);
        }
        for (int o = 0; o < KVSERVE_GRID_OUTS; o++) {
            v16 w_lo, w_hi;
            block_weights(BITS, blk, o, &w_lo, &w_hi);
            for (int r = 0; r < ROWS; r++) {
                acc[o][r] = v16_fma(w_lo, x_lo[r], acc[o][r]);
                acc[o][r] = v16_fma(w_hi, x_hi[r], acc[o][r]);
            }
        }
    }
    for (int o = 0; o < width; o++)
        for (int r = 0; r < ROWS; r++)
            out[r * out_stride + o] = v16_reduce_add(acc[o][r]) + (bias ? bias[o] : 0.0f);
}

/* `pass`(n rows, the format) for the run-time `bits`, each format a compile-time constant. */
#define KVSERVE_GRID_FORMATS(pass, n)                                         \
    if (bits == GRID_Q4)                                                      \
        pass(n, GRID_Q4, x, x_stride, k, strip, bias, out, out_stride, width); \
    else if (bits == GRID_I4)                                                 \
        pass(n, GRID_I4, x, x_stride, k, strip, bias, out, out_stride, width); \
    else if (bits == GRID_Q8)                                                 \
        pass(n, GRID_Q8, x, x_stride, k, strip, bias, out, out_stride, width); \
    else                                                                      \
        pass(n, GRID_Q8_HALVES, x, x_stride, k, strip, bias, out, out_stride, width);

/* AVX2 at 2-6 rows (a speculative step's verified rows, a small batch): its 16 registers hold one
 * row of strip_pass's sums, so it would take a pass per row, each widening every code again; the
 * widening costs about as many instructions as a row's FMAs, on cores where the FMAs are the
 * bound. Here the strip's outputs take turns instead: one output's sums for every row stay in
 * registers while the strip's blocks pass (a strip is a few KB: the later outputs find it in L1),
 * so each code is widened once. Each (output, row) sum is strip_pass's FMAs in strip_pass's
 * order: the same bits as one row at a time. */
#if KVSERVE_GRID_PASS_ROWS == 1
/* 12 of AVX2's 16 registers at 6 rows. One step's projections on SmolLM2's shapes, 2 threads, Zen 3
 * (linear_ab.py --grid): 16.2 / 16.9 ms at 5 / 6 rows, against 22.1 / 22.9 as a 4-row call and a
 * second one, and the tiles' 17.5-20.7 / 21.8-24.7. A seventh row's sums would leave no register
 * for the codes. */
#define KVSERVE_GRID_OUTPUT_ROWS 6

static inline __attribute__((always_inline)) void strip_pass_by_output(const int ROWS, const int BITS, const float *x,
                                                                       int64_t x_stride, int64_t k,
                                                                       const uint8_t *strip, const float *bias,
                                                                       float *out, int64_t out_stride, int width) {
    /* Two outputs a turn at two rows, so that 8 sums are in flight, as at 4 rows: 4 would leave
     * the FMAs waiting on their latency. A strip's missing outputs have zero codes: safe to run. */
    const int TURN = ROWS <= 2 ? 2 : 1; /* a constant once inlined */
    const int64_t step = block_bytes(BITS);
    const int64_t blocks = k / KVSERVE_GRID_GROUP;
    for (int o0 = 0; o0 < width; o0 += TURN) {
        v16 acc[2][KVSERVE_GRID_OUTPUT_ROWS];
        for (int t = 0; t < TURN; t++)
            for (int r = 0; r < ROWS; r++) acc[t][r] = v16_zero();
        for (int64_t g = 0; g < blocks; g++) {
            const uint8_t *blk = strip + g * step;
            if (o0 == 0) { /* the strip's first walk reads ahead in memory; the others are in L1 */
                _mm_prefetch((const char *)blk + KVSERVE_GRID_PREFETCH_BYTES, _MM_HINT_T0);
                _mm_prefetch((const char *)blk + KVSERVE_GRID_PREFETCH_BYTES + 64, _MM_HINT_T0);
            }
            for (int t = 0; t < TURN; t++) {
                v16 w_lo, w_hi;
                block_weights(BITS, blk, o0 + t, &w_lo, &w_hi);
                for (int r = 0; r < ROWS; r++) {
                    const float *xg = x + r * x_stride + g * KVSERVE_GRID_GROUP;
                    acc[t][r] = v16_fma(w_lo, v16_load(xg), acc[t][r]);
                    acc[t][r] = v16_fma(w_hi, v16_load(xg + 16), acc[t][r]);
                }
            }
        }
        for (int t = 0; t < TURN && o0 + t < width; t++)
            for (int r = 0; r < ROWS; r++)
                out[r * out_stride + o0 + t] = v16_reduce_add(acc[t][r]) + (bias ? bias[o0 + t] : 0.0f);
    }
}

#define KVSERVE_GRID_OUTPUT_CASE(n) \
    case n: KVSERVE_GRID_FORMATS(strip_pass_by_output, n) break;
#define KVSERVE_GRID_CALL_ROWS KVSERVE_GRID_OUTPUT_ROWS /* rows per call of strip_rows */
#else
#define KVSERVE_GRID_CALL_ROWS KVSERVE_GRID_PASS_ROWS
#endif

#define KVSERVE_GRID_CASE(n) \
    case n: KVSERVE_GRID_FORMATS(strip_pass, n) break;

static void strip_rows(int rows, int bits, const float *x, int64_t x_stride, int64_t k, const uint8_t *strip,
                       const float *bias, float *out, int64_t out_stride, int width) {
    switch (rows) {
        KVSERVE_GRID_CASE(1)
#if KVSERVE_GRID_PASS_ROWS > 1
        KVSERVE_GRID_CASE(2) KVSERVE_GRID_CASE(3) KVSERVE_GRID_CASE(4)
#else
        KVSERVE_GRID_OUTPUT_CASE(2) KVSERVE_GRID_OUTPUT_CASE(3) KVSERVE_GRID_OUTPUT_CASE(4)
        KVSERVE_GRID_OUTPUT_CASE(5) KVSERVE_GRID_OUTPUT_CASE(6)
#endif
        default: break;
    }
}
#endif

/* The rows one call of the strips takes in a pass, widening each code once: past them a step is
 * better served by cpu_linear.c's grid tiles. 0 where this build has no vector path. */
int kvserve_grid_strip_rows(void) {
#if defined(KVSERVE_VEC16)
    return KVSERVE_GRID_CALL_ROWS;
#else
    return 0;
#endif
}

/* Rows ids[0..count) of the float32 weight [n][k] whose strips `packed` holds, expanded into out
 * [count][k]: an embedding lookup over a table kept only as its codes (a tied embedding). Each value
 * is block_weights', the one the products above use. Returns nonzero where this build cannot run it
 * or an id is outside [0, n). */
int kvserve_grid_rows_f32(const uint8_t *packed, int bits, int64_t k, int64_t n, const int64_t *ids, int64_t count,
                          float *out) {
#if defined(KVSERVE_VEC16)
    if ((bits != GRID_Q4 && bits != GRID_I4 && bits != GRID_Q8 && bits != GRID_Q8_HALVES) || k % KVSERVE_GRID_GROUP)
        return 3;
    for (int64_t i = 0; i < count; i++)
        if (ids[i] < 0 || ids[i] >= n) return 4;
    const int64_t step = block_bytes(bits), strip_bytes = k / KVSERVE_GRID_GROUP * step;
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *strip = packed + ids[i] / KVSERVE_GRID_OUTS * strip_bytes;
        const int o = (int)(ids[i] % KVSERVE_GRID_OUTS);
        for (int64_t g = 0; g < k / KVSERVE_GRID_GROUP; g++) {
            v16 w_lo, w_hi;
#define KVSERVE_GRID_ROW(B) block_weights(B, strip + g * step, o, &w_lo, &w_hi)
            if (bits == GRID_Q4) KVSERVE_GRID_ROW(GRID_Q4);
            else if (bits == GRID_I4) KVSERVE_GRID_ROW(GRID_I4);
            else if (bits == GRID_Q8) KVSERVE_GRID_ROW(GRID_Q8);
            else KVSERVE_GRID_ROW(GRID_Q8_HALVES);
#undef KVSERVE_GRID_ROW
            v16_store(out + i * k + g * KVSERVE_GRID_GROUP, w_lo);
            v16_store(out + i * k + g * KVSERVE_GRID_GROUP + 16, w_hi);
        }
    }
    return 0;
#else
    (void)packed; (void)bits; (void)k; (void)n; (void)ids; (void)count; (void)out;
    return 1;
#endif
}

/* out [m][n] (row stride out_stride) = x [m][k] (row stride x_stride) times the grid-coded weight
 * `packed` (grid_weights.py's strip layout of `bits`-bit codes, k a multiple of 32), plus bias [n]
 * when given. Rows beyond kvserve_grid_strip_rows() take further passes over the weight. Returns
 * nonzero when this build cannot run it (no vector path: cpu_vec16.h) or the arguments are not a
 * layout it knows. */
int kvserve_grid_linear_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const uint8_t *packed, int bits,
                            int64_t n, const float *bias, float *out, int64_t out_stride, int num_threads) {
    if (bits == GRID_I4_Q8 || bits == GRID_Q4_Q8 || bits == GRID_Q4H_Q8 || bits == GRID_Q8_Q8
        || bits == GRID_Q8H_Q8)
        return kvserve_grid_int8_dot_f32(x, x_stride, m, k, packed, bits, n, bias, out, out_stride, num_threads);
#if defined(KVSERVE_VEC16)
    if ((bits != GRID_Q4 && bits != GRID_I4 && bits != GRID_Q8 && bits != GRID_Q8_HALVES) || k % KVSERVE_GRID_GROUP)
        return 3;
    const int64_t strips = (n + KVSERVE_GRID_OUTS - 1) / KVSERVE_GRID_OUTS;
    const int64_t strip_bytes = k / KVSERVE_GRID_GROUP * block_bytes(bits);
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t s = 0; s < strips; s++) {
        const int64_t col = s * KVSERVE_GRID_OUTS;
        const int width = n - col < KVSERVE_GRID_OUTS ? (int)(n - col) : KVSERVE_GRID_OUTS;
        for (int64_t r0 = 0; r0 < m; r0 += KVSERVE_GRID_CALL_ROWS) {
            const int rows = m - r0 < KVSERVE_GRID_CALL_ROWS ? (int)(m - r0) : KVSERVE_GRID_CALL_ROWS;
            strip_rows(rows, bits, x + r0 * x_stride, x_stride, k, packed + s * strip_bytes, bias ? bias + col : 0,
                       out + r0 * out_stride + col, out_stride, width);
        }
    }
    return 0;
#else
    (void)x; (void)x_stride; (void)m; (void)k; (void)packed; (void)bits; (void)n; (void)bias; (void)out;
    (void)out_stride; (void)num_threads;
    return 1;
#endif
}
