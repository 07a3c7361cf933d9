/* `--quantization int4` with integer dot products: 4-bit (and a GGUF file's 8-bit) codes in strips
 * of 4 outputs (the layout of cpu_grid_linear.c) times activations quantized to int8 per block of
 * 32, as llama.cpp multiplies its Q4 weights with Q8 activations.
 *
 * Why: at one row cpu_grid_linear.c's float strips spend ~7 vector instructions on every 32 weights
 * of an output (widen the codes, look each value up in a 16-entry table, two FMAs), and a batch-1
 * step of SmolLM2 waits on those instructions, not on memory. Here 4 outputs' 128 codes take ~10:
 * the 64 code bytes split into low and high nibbles, two vpdpbusd (64 byte products each, summed
 * four at a time into int32), one conversion and two float operations for the block's scale. Each
 * further row adds the last five, so up to 8 rows share a pass over a strip, and the kernel beats
 * the float32 int4 tiles at every row count measured (1-128: backend/models/quantize.py).
 *
 * The layouts (4 outputs' codes per block of 32 inputs, then their constants):
 * - GRID_I4_Q8, int4's codes: w = (q - 8) * s + z, s and z as bfloat16 (the values int4 rounds them
 *   to: 16 bytes fewer than float32's, a sixth of a step's reads);
 * - GRID_Q4_Q8, the grid codes of a weight on GGUF's Q4 grids (cpu_grid_linear.c's GRID_Q4 strips,
 *   float32 d and m): w = q * d + m, so `--quantization int4` on a Q4_1 or Q4_K file keeps the
 *   file's own weights instead of rounding them again; GRID_Q4H_Q8 the same with d and m as float16,
 *   where they are float16 values (Q4_1's are: a sixth fewer bytes; at one row the float32 form took
 *   1.13x the time of int4's 80-byte blocks);
 * - GRID_Q8_Q8, likewise GRID_Q8's strips (w = d * q, q in -127..127: Q8_0 and Q4_0's codes), whose
 *   32 code bytes per output and block are signed (dot_s8_s8).
 *
 * The arithmetic, per row, block g and output o (xs, xq: the row's block scale and int8 codes):
 *   GRID_I4_Q8:  sum_j w_j x_j  ~  s * xs * (sum_j q_j xq_j - 8 sum_j xq_j)  +  z * sum_j x_j
 *   GRID_Q4_Q8:  sum_j w_j x_j  ~  d * [xs * (sum_j q_j xq_j - 8 sum_j xq_j) + 8 sum_j x_j]  +  m * sum_j x_j
 * In both the rounded activations meet the codes centred on 8, d * (q - 8): uncentred (q in 0..15)
 * their rounding errors would add up twice as far (a trial on SmolLM2's Q4_1 codes, its logits
 * projection then rounded to int4 as well: +6.1 % perplexity uncentred, +3.9 % centred).
 * The zero's term uses the float32 sum of x, not the codes. The integer sums are exact, so the
 * AVX-512 VNNI and AVX-512 BW (vpmaddubsw + vpmaddwd) paths give the same bits. Activations are
 * rounded to 8 bits per block (|x| / max|x| * 127): this mode's accuracy cost grows by that
 * rounding, which loadtests/studies/quant_accuracy.py measures. A row's results do not depend on
 * the rows beside it nor on the thread count. */
#include <stdint.h>
#include <stdlib.h>

#define KVSERVE_I8DOT_GROUP 32
#define KVSERVE_I8DOT_OUTS 4
enum { GRID_I4_Q8 = 3, GRID_Q4_Q8 = 5, GRID_Q4H_Q8 = 6, GRID_Q8_Q8 = 9 }; /* grid_weights.py's kinds */

/* A strip's block: the 4 outputs' codes (16 bytes each, 32 for Q8), then their 4 scales (and 4
 * zeros): bfloat16 for GRID_I4_Q8, float16 for GRID_Q4H_Q8, else float32. */
static inline int64_t block_bytes(int format) {
    return format == GRID_Q8_Q8 ? KVSERVE_I8DOT_OUTS * 32 + KVSERVE_I8DOT_OUTS * 4
                                : KVSERVE_I8DOT_OUTS * 16 + KVSERVE_I8DOT_OUTS * (format == GRID_Q4_Q8 ? 8 : 4);
}
#define KVSERVE_I8DOT_MAX_ROWS 8 /* rows per pass over a strip */
#define KVSERVE_I8DOT_PREFETCH_BYTES (16 * 1024)

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

/* One row's activations as int8 codes per block of 32, with what the products need of each block. */
typedef struct {
    int8_t *codes;     /* [k] */
    float *scale;      /* [k / 32]: max |x| / 127 */
    float *code_term;  /* [k / 32]: the scale's factor besides the codes' dot: -8 * xs * sum(xq) (+ 8 * sum(x), Q4) */
    float *sum;        /* [k / 32]: the float32 sum of x (the weights' zero term) */
} quantized_row;

static void quantize_row(const float *x, int64_t k, int format, quantized_row q) {
    for (int64_t g = 0; g < k / KVSERVE_I8DOT_GROUP; g++) {
        const float *xg = x + g * KVSERVE_I8DOT_GROUP;
        const __m512 lo = _mm512_loadu_ps(xg), hi = _mm512_loadu_ps(xg + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        const float scale = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        /* Round to nearest (even), saturating: amax * (127 / amax) may round just above 127. */
        const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(inverse)));
        const __m512i q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(inverse)));
        _mm_storeu_si128((__m128i *)(q.codes + g * KVSERVE_I8DOT_GROUP), _mm512_cvtsepi32_epi8(q_lo));
        _mm_storeu_si128((__m128i *)(q.codes + g * KVSERVE_I8DOT_GROUP + 16), _mm512_cvtsepi32_epi8(q_hi));
        const int code_sum = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_max_epi32(_mm512_min_epi32(q_lo,
                                                     _mm512_set1_epi32(127)), _mm512_set1_epi32(-128)),
                                                     _mm512_max_epi32(_mm512_min_epi32(q_hi, _mm512_set1_epi32(127)),
                                                                      _mm512_set1_epi32(-128))));
        q.scale[g] = scale;
        q.sum[g] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
        const int centred = format == GRID_Q4_Q8 || format == GRID_Q4H_Q8; /* codes 0..15 moved to -8..7 */
        q.code_term[g] = -8.0f * scale * (float)code_sum + (centred ? 8.0f * q.sum[g] : 0.0f);
    }
}

/* sum over each int32 lane of 4 products of unsigned codes (0..15) and signed activation codes. */
static inline __attribute__((always_inline)) __m512i dot_u4_s8(__m512i acc, __m512i codes, __m512i x) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, codes, x);
#else
    /* Pairs as int16 (at most 2 * 15 * 128: no saturation), then pairs of those as int32. */
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(codes, x), _mm512_set1_epi16(1)));
#endif
}

/* 4 bfloat16 at p as float32 (exact: the high half of each). */
static inline __attribute__((always_inline)) __m128 bf16x4(const uint8_t *p) {
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)p)), 16));
}

/* 4 float16 at p as float32 (exact). */
static inline __attribute__((always_inline)) __m128 f16x4(const uint8_t *p) {
    return _mm512_castps512_ps128(_mm512_cvtph_ps(_mm256_zextsi128_si256(_mm_loadl_epi64((const __m128i *)p))));
}

/* ROWS rows times one strip of 4 outputs in FORMAT. */
static inline __attribute__((always_inline)) void strip_pass(const int ROWS, const int FORMAT,
                                                             const quantized_row *rows, int64_t k,
                                                             const uint8_t *strip, const float *bias, float *out,
                                                             int64_t out_stride, int width) {
    __m512 acc[KVSERVE_I8DOT_MAX_ROWS];
    __m128 term[KVSERVE_I8DOT_MAX_ROWS];
    for (int r = 0; r < ROWS; r++) {
        acc[r] = _mm512_setzero_ps();
        term[r] = _mm_setzero_ps();
    }
    /* Lane i of a product belongs to output i / 4: each output's scale repeated over its 4 lanes. */
    const __m512i by_output = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    for (int64_t g = 0; g < k / KVSERVE_I8DOT_GROUP; g++) {
        const uint8_t *blk = strip + g * block_bytes(FORMAT);
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES, _MM_HINT_T0); /* never faults */
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES + 64, _MM_HINT_T0);
        /* 4 outputs x 16 bytes: inputs 0-15 in the low nibbles, 16-31 in the high ones. */
        const __m512i codes = _mm512_loadu_si512(blk);
        const __m512i low = _mm512_and_si512(codes, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(codes, 4), nibble);
        const uint8_t *constants = blk + KVSERVE_I8DOT_OUTS * 16;
        const __m128 s = FORMAT == GRID_I4_Q8    ? bf16x4(constants)
                         : FORMAT == GRID_Q4H_Q8 ? f16x4(constants)
                                                 : _mm_loadu_ps((const float *)constants);
        const __m128 z = FORMAT == GRID_I4_Q8    ? bf16x4(constants + 8)
                         : FORMAT == GRID_Q4H_Q8 ? f16x4(constants + 8)
                                                 : _mm_loadu_ps((const float *)constants + 4);
        const __m512 s_lanes = _mm512_permutexvar_ps(by_output, _mm512_castps128_ps512(s));
        for (int r = 0; r < ROWS; r++) {
            const int8_t *xq = rows[r].codes + g * KVSERVE_I8DOT_GROUP;
            const __m512i x_low = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xq));
            const __m512i x_high = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xq + 16)));
            const __m512i dots = dot_u4_s8(dot_u4_s8(_mm512_setzero_si512(), low, x_low), high, x_high);
            const __m512 scaled = _mm512_mul_ps(s_lanes, _mm512_set1_ps(rows[r].scale[g]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scaled, acc[r]);
            term[r] = _mm_fmadd_ps(s, _mm_set1_ps(rows[r].code_term[g]), term[r]);
            term[r] = _mm_fmadd_ps(z, _mm_set1_ps(rows[r].sum[g]), term[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float lanes[16], terms[4];
        _mm512_storeu_ps(lanes, acc[r]);
        _mm_storeu_ps(terms, term[r]);
        for (int o = 0; o < width; o++) {
            const float *l = lanes + 4 * o;
            out[r * out_stride + o] = ((l[0] + l[1]) + (l[2] + l[3])) + terms[o] + (bias ? bias[o] : 0.0f);
        }
    }
}

#define KVSERVE_I8DOT_ROWS_CASE(n, format) \
    case n: strip_pass(n, format, q, k, strip, bias, out, out_stride, width); break;
#define KVSERVE_I8DOT_ROWS(format)                                                                    \
    switch (rows) {                                                                                   \
        KVSERVE_I8DOT_ROWS_CASE(1, format) KVSERVE_I8DOT_ROWS_CASE(2, format)                         \
        KVSERVE_I8DOT_ROWS_CASE(3, format) KVSERVE_I8DOT_ROWS_CASE(4, format)                         \
        KVSERVE_I8DOT_ROWS_CASE(5, format) KVSERVE_I8DOT_ROWS_CASE(6, format)                         \
        KVSERVE_I8DOT_ROWS_CASE(7, format) default: strip_pass(8, format, q, k, strip, bias, out, out_stride, width); \
    }

/* Per int32 lane, the sum of 4 products of signed 8-bit weight codes (-127..127) and activation codes.
 * VNNI takes an unsigned first operand: (q + 128) times x, less 128 times x. Without it the signs
 * move onto x, |q| times +-x by pairs (at most 2 * 127 * 128: no saturation). Exact either way. */
static inline __attribute__((always_inline)) __m512i dot_s8_s8(__m512i codes, __m512i x) {
#if defined(__AVX512VNNI__)
    const __m512i offset = _mm512_set1_epi8((char)0x80);
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(codes, offset), x),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, x));
#else
    const __m512i signed_x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(codes), _mm512_setzero_si512(), x);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(codes), signed_x), _mm512_set1_epi16(1));
#endif
}

/* ROWS rows times one strip of 4 outputs in GRID_Q8_Q8 (Q8's strips: w = d * q): two outputs' 32
 * codes a vector, each lane 4 inputs of one output. */
static inline __attribute__((always_inline)) void strip_pass_q8(const int ROWS, const quantized_row *rows, int64_t k,
                                                                const uint8_t *strip, const float *bias, float *out,
                                                                int64_t out_stride, int width) {
    __m512 acc[2][KVSERVE_I8DOT_MAX_ROWS];
    for (int r = 0; r < ROWS; r++) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
    const __m512i first_two = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i last_two = _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2);
    for (int64_t g = 0; g < k / KVSERVE_I8DOT_GROUP; g++) {
        const uint8_t *blk = strip + g * block_bytes(GRID_Q8_Q8);
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES, _MM_HINT_T0); /* never faults */
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES + 128, _MM_HINT_T0);
        const __m512i codes[2] = {_mm512_loadu_si512(blk), _mm512_loadu_si512(blk + 64)};
        const __m512 d = _mm512_castps128_ps512(_mm_loadu_ps((const float *)(blk + KVSERVE_I8DOT_OUTS * 32)));
        const __m512 d_lanes[2] = {_mm512_permutexvar_ps(first_two, d), _mm512_permutexvar_ps(last_two, d)};
        for (int r = 0; r < ROWS; r++) {
            const int8_t *xq = rows[r].codes + g * KVSERVE_I8DOT_GROUP;
            const __m512i x = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xq));
            const __m512 xs = _mm512_set1_ps(rows[r].scale[g]);
            for (int h = 0; h < 2; h++)
                acc[h][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot_s8_s8(codes[h], x)), _mm512_mul_ps(d_lanes[h], xs),
                                            acc[h][r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float lanes[32];
        _mm512_storeu_ps(lanes, acc[0][r]);
        _mm512_storeu_ps(lanes + 16, acc[1][r]);
        for (int o = 0; o < width; o++) {
            const float *l = lanes + 8 * o;
            out[r * out_stride + o] = (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])))
                                      + (bias ? bias[o] : 0.0f);
        }
    }
}

#define KVSERVE_I8DOT_Q8_CASE(n) \
    case n: strip_pass_q8(n, q, k, strip, bias, out, out_stride, width); break;

static void strip_rows(int rows, int format, const quantized_row *q, int64_t k, const uint8_t *strip,
                       const float *bias, float *out, int64_t out_stride, int width) {
    if (format == GRID_Q8_Q8) {
        switch (rows) {
            KVSERVE_I8DOT_Q8_CASE(1) KVSERVE_I8DOT_Q8_CASE(2) KVSERVE_I8DOT_Q8_CASE(3) KVSERVE_I8DOT_Q8_CASE(4)
            KVSERVE_I8DOT_Q8_CASE(5) KVSERVE_I8DOT_Q8_CASE(6) KVSERVE_I8DOT_Q8_CASE(7)
            default: strip_pass_q8(8, q, k, strip, bias, out, out_stride, width); break;
        }
    } else if (format == GRID_I4_Q8) {
        KVSERVE_I8DOT_ROWS(GRID_I4_Q8)
    } else if (format == GRID_Q4H_Q8) {
        KVSERVE_I8DOT_ROWS(GRID_Q4H_Q8)
    } else {
        KVSERVE_I8DOT_ROWS(GRID_Q4_Q8)
    }
}
#endif

/* Whether this build has the kernel below (AVX-512 F and BW). */
int kvserve_grid_int8_dot_available(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    return 1;
#else
    return 0;
#endif
}

/* out [m][n] = x [m][k] times the strips `packed` in `format` (GRID_I4_Q8, GRID_Q4_Q8, GRID_Q4H_Q8 or GRID_Q8_Q8),
 * with x quantized to int8 per block of 32, plus bias [n] when given. Returns nonzero where this
 * build cannot run it, the format is another, k is not a multiple of 32, or memory for the quantized
 * rows is short. */
int kvserve_grid_int8_dot_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const uint8_t *packed,
                              int format, int64_t n, const float *bias, float *out, int64_t out_stride,
                              int num_threads) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if ((format != GRID_I4_Q8 && format != GRID_Q4_Q8 && format != GRID_Q4H_Q8 && format != GRID_Q8_Q8)
        || k % KVSERVE_I8DOT_GROUP || m < 0)
        return 3;
    const int64_t groups = k / KVSERVE_I8DOT_GROUP;
    char *scratch = malloc((size_t)(m * k + 3 * m * groups * (int64_t)sizeof(float) + 1));
    if (!scratch) return 5;
    float *floats = (float *)scratch;
    int8_t *codes = (int8_t *)(floats + 3 * m * groups);
    quantized_row *q = malloc((size_t)(m + 1) * sizeof(quantized_row));
    if (!q) {
        free(scratch);
        return 5;
    }
    for (int64_t r = 0; r < m; r++) {
        q[r] = (quantized_row){codes + r * k, floats + r * groups, floats + (m + r) * groups,
                               floats + (2 * m + r) * groups};
        quantize_row(x + r * x_stride, k, format, q[r]);
    }
    const int64_t strips = (n + KVSERVE_I8DOT_OUTS - 1) / KVSERVE_I8DOT_OUTS;
    const int64_t strip_bytes = groups * block_bytes(format);
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t s = 0; s < strips; s++) {
        const int64_t col = s * KVSERVE_I8DOT_OUTS;
        const int width = n - col < KVSERVE_I8DOT_OUTS ? (int)(n - col) : KVSERVE_I8DOT_OUTS;
        for (int64_t r0 = 0; r0 < m; r0 += KVSERVE_I8DOT_MAX_ROWS) {
            const int rows = m - r0 < KVSERVE_I8DOT_MAX_ROWS ? (int)(m - r0) : KVSERVE_I8DOT_MAX_ROWS;
            strip_rows(rows, format, q + r0, k, packed + s * strip_bytes, bias ? bias + col : 0,
                       out + r0 * out_stride + col, out_stride, width);
        }
    }
    free(q);
    free(scratch);
    return 0;
#else
    (void)x; (void)x_stride; (void)m; (void)k; (void)packed; (void)format; (void)n; (void)bias; (void)out;
    (void)out_stride; (void)num_threads;
    return 1;
#endif
}
