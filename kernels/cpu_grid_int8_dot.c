/* `--quantization int4` with integer dot products: 4-bit (and a GGUF file's 8-bit) codes in strips
 * of 4 outputs (the layout of cpu_grid_linear.c) times activations quantized to int8 per block of
 * 32, as llama.cpp multiplies its Q4 weights with Q8 activations.
 *
 * Why: at one row cpu_grid_linear.c's float strips spend ~7 vector instructions on every 32 weights
 * of an output (widen the codes, look each value up in a 16-entry table, two FMAs), and a batch-1
 * step of SmolLM2 waits on those instructions, not on memory. Here 4 outputs' 128 codes take ~10:
 * the 64 code bytes split into low and high nibbles, two vpdpbusd (64 byte products each, summed
 * four at a time into int32), one conversion and two float operations for the block's scale. Each
 * further row adds the last five, so up to 8 rows share a pass over a strip (4 under AVX2), and the
 * kernel beats the float32 int4 tiles at every row count measured (1-128: backend/models/quantize.py).
 * Under AVX2 (no VNNI) each vpdpbusd is vpmaddubsw + vpmaddwd on two 256-bit halves.
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
 *   32 code bytes per output and block are signed (b64_dot_s8_s8);
 * - GRID_Q8H_Q8, GRID_Q8_HALVES's strips (w = d * q + m with d and m per 16 inputs, q in -128..127:
 *   Q5_1's, Q5_K's and Q6_K's codes, the types a Q4_K_M file mixes in). A lane's 4 products lie in
 *   one half, so each lane takes its half's d; the m term takes the float32 sum of each half of x.
 *
 * The arithmetic, per row, block g and output o (xs, xq: the row's block scale and int8 codes):
 *   GRID_I4_Q8:  sum_j w_j x_j  ~  s * xs * (sum_j q_j xq_j - 8 sum_j xq_j)  +  z * sum_j x_j
 *   GRID_Q4_Q8:  sum_j w_j x_j  ~  d * [xs * (sum_j q_j xq_j - 8 sum_j xq_j) + 8 sum_j x_j]  +  m * sum_j x_j
 * In both the rounded activations meet the codes centred on 8, d * (q - 8): uncentred (q in 0..15)
 * their rounding errors would add up twice as far (a trial on SmolLM2's Q4_1 codes, its logits
 * projection then rounded to int4 as well: +6.1 % perplexity uncentred, +3.9 % centred).
 * The zero's term uses the float32 sum of x, not the codes. The integer sums are exact, so the
 * AVX-512 VNNI, AVX-512 BW (vpmaddubsw + vpmaddwd) and AVX2 paths give the same bits (the float
 * operations are cpu_vec16.h's, the same lane by lane). Activations are rounded to 8 bits per block
 * (|x| / max|x| * 127): this mode's accuracy cost grows by that rounding, which
 * loadtests/studies/quant_accuracy.py measures. A row's results do not depend on the rows beside it
 * nor on the thread count. */
#include <stdint.h>
#include <stdlib.h>

#define KVSERVE_I8DOT_GROUP 32
#define KVSERVE_I8DOT_OUTS 4
enum { GRID_I4_Q8 = 3, GRID_Q4_Q8 = 5, GRID_Q4H_Q8 = 6, GRID_Q8_Q8 = 9, GRID_Q8H_Q8 = 17 }; /* grid_weights.py's kinds */

/* A strip's block: the 4 outputs' codes (16 bytes each, 32 for Q8), then their 4 scales (and 4
 * zeros): bfloat16 for GRID_I4_Q8, float16 for GRID_Q4H_Q8, else float32; GRID_Q8H_Q8's d of the
 * first 16 inputs, d of the last 16, then m likewise. */
static inline int64_t block_bytes(int format) {
    return format == GRID_Q8H_Q8  ? KVSERVE_I8DOT_OUTS * 32 + KVSERVE_I8DOT_OUTS * 16
           : format == GRID_Q8_Q8 ? KVSERVE_I8DOT_OUTS * 32 + KVSERVE_I8DOT_OUTS * 4
                                : KVSERVE_I8DOT_OUTS * 16 + KVSERVE_I8DOT_OUTS * (format == GRID_Q4_Q8 ? 8 : 4);
}
#define KVSERVE_I8DOT_PREFETCH_BYTES (16 * 1024)

#include "cpu_vec16.h"

#define I8_INLINE static inline __attribute__((always_inline))

/* The integer vectors the kernel needs beside cpu_vec16.h's float ones: a b64 is 64 bytes, or 16 int32
 * lanes in v16's order. AVX-512 BW has one register for it; AVX2 two (lanes 0-7, 8-15), whose lanes
 * take the same integer operations, so every integer sum is the same and every float operation after
 * it (v16's) is the same lane by lane: the two builds give the same bits
 * (tests/kernels/test_cpu_vector_isas.py). */
#if defined(__AVX512F__)
#if defined(__AVX512BW__)
#define KVSERVE_I8DOT 1
#define KVSERVE_I8DOT_MAX_ROWS 8 /* rows per pass over a strip: 16 of the 32 registers accumulate */
typedef __m512i b64;

I8_INLINE b64 b64_load(const uint8_t *p) { return _mm512_loadu_si512(p); }
/* Each byte's low nibble; each byte's high nibble. */
I8_INLINE b64 b64_low4(b64 v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
I8_INLINE b64 b64_high4(b64 v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
/* 16 bytes at p in each 128-bit block; 32 bytes at p in each 256-bit half. */
I8_INLINE b64 b64_repeat16(const int8_t *p) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p)); }
I8_INLINE b64 b64_repeat32(const int8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }
/* Per int32 lane: the 4 products of unsigned codes (0..15) `low` and signed x `x_low`, plus the 4 of
 * `high` and `x_high`. */
I8_INLINE b64 b64_dot_u4_s8(b64 low, b64 x_low, b64 high, b64 x_high) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), low, x_low), high, x_high);
#else
    /* Pairs as int16, both halves' pairs added (at most 4 * 15 * 128: no saturation), then as int32. */
    return _mm512_madd_epi16(_mm512_add_epi16(_mm512_maddubs_epi16(low, x_low), _mm512_maddubs_epi16(high, x_high)),
                             _mm512_set1_epi16(1));
#endif
}
/* Per int32 lane, the sum of 4 products of signed 8-bit weight codes (-127..127) and activation codes.
 * VNNI takes an unsigned first operand: (q + 128) times x, less 128 times x. Without it the signs
 * move onto x, |q| times +-x by pairs (at most 2 * 127 * 128: no saturation). Exact either way. */
I8_INLINE b64 b64_dot_s8_s8(b64 codes, b64 x) {
#if defined(__AVX512VNNI__)
    const __m512i offset = _mm512_set1_epi8((char)0x80);
    return _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(codes, offset), x),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, x));
#else
    const __m512i signed_x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(codes), _mm512_setzero_si512(), x);
    return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(codes), signed_x), _mm512_set1_epi16(1));
#endif
}
I8_INLINE v16 v16_from_b64(b64 v) { return _mm512_cvtepi32_ps(v); }
/* Lanes 4i..4i+3: s[i]. */
I8_INLINE v16 v16_spread4(__m128 s) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(s));
}
/* Lanes 0-7: d[0]; lanes 8-15: d[1]. */
I8_INLINE v16 v16_spread2(const float *d) {
    return _mm512_insertf32x8(_mm512_set1_ps(d[0]), _mm256_set1_ps(d[1]), 1);
}
/* d8: 4 outputs' d of their first 16 inputs, then of their last 16. Lanes 0-3: output 2p's first,
 * 4-7: its last, 8-11: output 2p + 1's first, 12-15: its last. */
I8_INLINE v16 v16_spread_halves(const float *d8, int p) {
    const __m512i by_lane = _mm512_add_epi32(_mm512_set_epi32(5, 5, 5, 5, 1, 1, 1, 1, 4, 4, 4, 4, 0, 0, 0, 0),
                                             _mm512_set1_epi32(2 * p));
    return _mm512_permutexvar_ps(by_lane, _mm512_castps256_ps512(_mm256_loadu_ps(d8)));
}
/* 32 floats rounded to int8 codes (x * inverse to nearest, saturated) at `codes`; returns their sum. */
I8_INLINE int quantize_block(const float *x, float inverse, int8_t *codes) {
    const __m512i lo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(inverse)));
    const __m512i hi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), _mm512_set1_ps(inverse)));
    _mm_storeu_si128((__m128i *)codes, _mm512_cvtsepi32_epi8(lo));
    _mm_storeu_si128((__m128i *)(codes + 16), _mm512_cvtsepi32_epi8(hi));
    const __m512i top = _mm512_set1_epi32(127), bottom = _mm512_set1_epi32(-128);
    return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_max_epi32(_mm512_min_epi32(lo, top), bottom),
                                                    _mm512_max_epi32(_mm512_min_epi32(hi, top), bottom)));
}
/* The largest |x| of 32 floats. */
I8_INLINE float block_amax(const float *x) {
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x)), _mm512_abs_ps(_mm512_loadu_ps(x + 16))));
}
#endif
#elif defined(KVSERVE_VEC16) /* AVX2 + FMA + F16C */
#define KVSERVE_I8DOT 1
/* 3 registers a row accumulate (its 16 lanes and its 4 terms): 4 rows and the shared codes, scales
 * and constants fill the 16 (more spill to the stack). */
#define KVSERVE_I8DOT_MAX_ROWS 4
typedef struct { __m256i lo, hi; } b64;

I8_INLINE b64 b64_make(__m256i lo, __m256i hi) { b64 r = {lo, hi}; return r; }
I8_INLINE b64 b64_load(const uint8_t *p) {
    return b64_make(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32)));
}
I8_INLINE b64 b64_low4(b64 v) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    return b64_make(_mm256_and_si256(v.lo, nibble), _mm256_and_si256(v.hi, nibble));
}
I8_INLINE b64 b64_high4(b64 v) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    return b64_make(_mm256_and_si256(_mm256_srli_epi16(v.lo, 4), nibble),
                    _mm256_and_si256(_mm256_srli_epi16(v.hi, 4), nibble));
}
I8_INLINE b64 b64_repeat16(const int8_t *p) {
    const __m256i r = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return b64_make(r, r);
}
I8_INLINE b64 b64_repeat32(const int8_t *p) {
    const __m256i r = _mm256_loadu_si256((const __m256i *)p);
    return b64_make(r, r);
}
I8_INLINE __m256i dot_u4_s8_half(__m256i low, __m256i x_low, __m256i high, __m256i x_high) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(low, x_low), _mm256_maddubs_epi16(high, x_high)),
                             _mm256_set1_epi16(1));
}
I8_INLINE b64 b64_dot_u4_s8(b64 low, b64 x_low, b64 high, b64 x_high) {
    return b64_make(dot_u4_s8_half(low.lo, x_low.lo, high.lo, x_high.lo),
                    dot_u4_s8_half(low.hi, x_low.hi, high.hi, x_high.hi));
}
/* As AVX-512 BW: |q| times x with q's sign (vpsignb: zero where q is, as |q| is then). */
I8_INLINE __m256i dot_s8_s8_half(__m256i codes, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(codes), _mm256_sign_epi8(x, codes)),
                             _mm256_set1_epi16(1));
}
I8_INLINE b64 b64_dot_s8_s8(b64 codes, b64 x) {
    return b64_make(dot_s8_s8_half(codes.lo, x.lo), dot_s8_s8_half(codes.hi, x.hi));
}
I8_INLINE v16 v16_from_b64(b64 v) { return v16_make(_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)); }
I8_INLINE v16 v16_spread4(__m128 s) {
    const __m256 s2 = _mm256_castps128_ps256(s);
    return v16_make(_mm256_permutevar8x32_ps(s2, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)),
                    _mm256_permutevar8x32_ps(s2, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)));
}
I8_INLINE v16 v16_spread2(const float *d) { return v16_make(_mm256_set1_ps(d[0]), _mm256_set1_ps(d[1])); }
I8_INLINE v16 v16_spread_halves(const float *d8, int p) {
    const __m256 d = _mm256_loadu_ps(d8);
    const __m256i first = _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4), _mm256_set1_epi32(2 * p));
    return v16_make(_mm256_permutevar8x32_ps(d, first),
                    _mm256_permutevar8x32_ps(d, _mm256_add_epi32(first, _mm256_set1_epi32(1))));
}
/* 16 int32 as 16 saturated int8, in order (the packs interleave 128-bit blocks: put them back). */
I8_INLINE __m128i saturated_i8(__m256i lo, __m256i hi) {
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
    return _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}
I8_INLINE int quantize_block(const float *x, float inverse, int8_t *codes) {
    const __m256 by = _mm256_set1_ps(inverse);
    __m256i q[4];
    for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), by));
    _mm_storeu_si128((__m128i *)codes, saturated_i8(q[0], q[1]));
    _mm_storeu_si128((__m128i *)(codes + 16), saturated_i8(q[2], q[3]));
    const __m256i top = _mm256_set1_epi32(127), bottom = _mm256_set1_epi32(-128);
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) sum = _mm256_add_epi32(sum, _mm256_max_epi32(_mm256_min_epi32(q[i], top), bottom));
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, _MM_SHUFFLE(2, 3, 0, 1))));
}
I8_INLINE float block_amax(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
    for (int i = 1; i < 4; i++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)));
    const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    const __m128 m2 = _mm_max_ps(m4, _mm_shuffle_ps(m4, m4, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, _MM_SHUFFLE(2, 3, 0, 1))));
}
#endif

#if defined(KVSERVE_I8DOT)
/* One row's activations as int8 codes per block of 32, with what the products need of each block. */
typedef struct {
    int8_t *codes;     /* [k] */
    float *scale;      /* [k / 32]: max |x| / 127 */
    float *code_term;  /* [k / 32]: the scale's factor besides the codes' dot: -8 * xs * sum(xq) (+ 8 * sum(x), Q4) */
    float *sum;        /* [k / 32]: the float32 sum of x (the weights' zero term) */
    float *half_sum;   /* [k / 16], GRID_Q8H_Q8 only: the float32 sum of each 16 inputs of x (its m terms) */
} quantized_row;

static void quantize_row(const float *x, int64_t k, int format, quantized_row q) {
    for (int64_t g = 0; g < k / KVSERVE_I8DOT_GROUP; g++) {
        const float *xg = x + g * KVSERVE_I8DOT_GROUP;
        const float amax = block_amax(xg);
        const float scale = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        /* Round to nearest (even), saturating: amax * (127 / amax) may round just above 127. */
        const int code_sum = quantize_block(xg, inverse, q.codes + g * KVSERVE_I8DOT_GROUP);
        q.scale[g] = scale;
        q.sum[g] = v16_reduce_add(v16_add(v16_load(xg), v16_load(xg + 16)));
        const int centred = format == GRID_Q4_Q8 || format == GRID_Q4H_Q8; /* codes 0..15 moved to -8..7 */
        q.code_term[g] = -8.0f * scale * (float)code_sum + (centred ? 8.0f * q.sum[g] : 0.0f);
        if (format == GRID_Q8H_Q8) {
            q.half_sum[2 * g] = v16_reduce_add(v16_load(xg));
            q.half_sum[2 * g + 1] = v16_reduce_add(v16_load(xg + 16));
        }
    }
}

/* 4 bfloat16 at p as float32 (exact: the high half of each). */
I8_INLINE __m128 bf16x4(const uint8_t *p) {
    return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)p)), 16));
}

/* 4 float16 at p as float32 (exact). */
I8_INLINE __m128 f16x4(const uint8_t *p) { return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p)); }

/* ROWS rows times one strip of 4 outputs in FORMAT. */
I8_INLINE void strip_pass(const int ROWS, const int FORMAT, const quantized_row *rows, int64_t k, const uint8_t *strip,
                          const float *bias, float *out, int64_t out_stride, int width) {
    v16 acc[KVSERVE_I8DOT_MAX_ROWS];
    __m128 term[KVSERVE_I8DOT_MAX_ROWS];
    for (int r = 0; r < ROWS; r++) {
        acc[r] = v16_zero();
        term[r] = _mm_setzero_ps();
    }
    for (int64_t g = 0; g < k / KVSERVE_I8DOT_GROUP; g++) {
        const uint8_t *blk = strip + g * block_bytes(FORMAT);
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES, _MM_HINT_T0); /* never faults */
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES + 64, _MM_HINT_T0);
        /* 4 outputs x 16 bytes: inputs 0-15 in the low nibbles, 16-31 in the high ones. Lane i of a
         * product belongs to output i / 4. */
        const b64 codes = b64_load(blk);
        const b64 low = b64_low4(codes), high = b64_high4(codes);
        const uint8_t *constants = blk + KVSERVE_I8DOT_OUTS * 16;
        const __m128 s = FORMAT == GRID_I4_Q8    ? bf16x4(constants)
                         : FORMAT == GRID_Q4H_Q8 ? f16x4(constants)
                                                 : _mm_loadu_ps((const float *)constants);
        const __m128 z = FORMAT == GRID_I4_Q8    ? bf16x4(constants + 8)
                         : FORMAT == GRID_Q4H_Q8 ? f16x4(constants + 8)
                                                 : _mm_loadu_ps((const float *)constants + 4);
        const v16 s_lanes = v16_spread4(s); /* each output's scale over its 4 lanes */
        for (int r = 0; r < ROWS; r++) {
            const int8_t *xq = rows[r].codes + g * KVSERVE_I8DOT_GROUP;
            const b64 dots = b64_dot_u4_s8(low, b64_repeat16(xq), high, b64_repeat16(xq + 16));
            const v16 scaled = v16_mul(s_lanes, v16_set1(rows[r].scale[g]));
            acc[r] = v16_fma(v16_from_b64(dots), scaled, acc[r]);
            term[r] = _mm_fmadd_ps(s, _mm_set1_ps(rows[r].code_term[g]), term[r]);
            term[r] = _mm_fmadd_ps(z, _mm_set1_ps(rows[r].sum[g]), term[r]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float lanes[16], terms[4];
        v16_store(lanes, acc[r]);
        _mm_storeu_ps(terms, term[r]);
        for (int o = 0; o < width; o++) {
            const float *l = lanes + 4 * o;
            out[r * out_stride + o] = ((l[0] + l[1]) + (l[2] + l[3])) + terms[o] + (bias ? bias[o] : 0.0f);
        }
    }
}

/* ROWS rows times one strip of 4 outputs in GRID_Q8_Q8 (Q8's strips: w = d * q) or, with HALVES,
 * GRID_Q8H_Q8 (w = d * q + m, d and m per 16 inputs): two outputs' 32 codes a b64, each lane 4
 * inputs of one output (of one half). */
I8_INLINE void strip_pass_q8(const int ROWS, const int HALVES, const quantized_row *rows, int64_t k,
                             const uint8_t *strip, const float *bias, float *out, int64_t out_stride, int width) {
    const int FORMAT = HALVES ? GRID_Q8H_Q8 : GRID_Q8_Q8;
    v16 acc[2][KVSERVE_I8DOT_MAX_ROWS];
    __m128 term[KVSERVE_I8DOT_MAX_ROWS];
    for (int r = 0; r < ROWS; r++) {
        acc[0][r] = acc[1][r] = v16_zero();
        term[r] = _mm_setzero_ps();
    }
    for (int64_t g = 0; g < k / KVSERVE_I8DOT_GROUP; g++) {
        const uint8_t *blk = strip + g * block_bytes(FORMAT);
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES, _MM_HINT_T0); /* never faults */
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)blk + KVSERVE_I8DOT_PREFETCH_BYTES + 128, _MM_HINT_T0);
        const b64 codes[2] = {b64_load(blk), b64_load(blk + 64)};
        const float *d = (const float *)(blk + KVSERVE_I8DOT_OUTS * 32);
        const v16 d_lanes[2] = {HALVES ? v16_spread_halves(d, 0) : v16_spread2(d),
                                HALVES ? v16_spread_halves(d, 1) : v16_spread2(d + 2)};
        for (int r = 0; r < ROWS; r++) {
            const b64 x = b64_repeat32(rows[r].codes + g * KVSERVE_I8DOT_GROUP);
            const v16 xs = v16_set1(rows[r].scale[g]);
            for (int h = 0; h < 2; h++)
                acc[h][r] = v16_fma(v16_from_b64(b64_dot_s8_s8(codes[h], x)), v16_mul(d_lanes[h], xs), acc[h][r]);
            if (HALVES) {
                term[r] = _mm_fmadd_ps(_mm_loadu_ps(d + 8), _mm_set1_ps(rows[r].half_sum[2 * g]), term[r]);
                term[r] = _mm_fmadd_ps(_mm_loadu_ps(d + 12), _mm_set1_ps(rows[r].half_sum[2 * g + 1]), term[r]);
            }
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float lanes[32], terms[4];
        v16_store(lanes, acc[0][r]);
        v16_store(lanes + 16, acc[1][r]);
        _mm_storeu_ps(terms, term[r]);
        for (int o = 0; o < width; o++) {
            const float *l = lanes + 8 * o;
            const float dots = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
            out[r * out_stride + o] = (HALVES ? dots + terms[o] : dots) + (bias ? bias[o] : 0.0f);
        }
    }
}

/* `pass`(ROWS, variant, ...) for the run-time `rows` (1..KVSERVE_I8DOT_MAX_ROWS), each row count a
 * compile-time constant. */
#define KVSERVE_I8DOT_CASE(pass, n, variant) \
    case n: pass(n, variant, q, k, strip, bias, out, out_stride, width); break;
#if KVSERVE_I8DOT_MAX_ROWS == 8
#define KVSERVE_I8DOT_MORE_ROWS(pass, variant) \
    KVSERVE_I8DOT_CASE(pass, 4, variant) KVSERVE_I8DOT_CASE(pass, 5, variant) \
    KVSERVE_I8DOT_CASE(pass, 6, variant) KVSERVE_I8DOT_CASE(pass, 7, variant)
#else
#define KVSERVE_I8DOT_MORE_ROWS(pass, variant)
#endif
#define KVSERVE_I8DOT_ROWS(pass, variant)                                                                \
    switch (rows) {                                                                                      \
        KVSERVE_I8DOT_CASE(pass, 1, variant) KVSERVE_I8DOT_CASE(pass, 2, variant)                        \
        KVSERVE_I8DOT_CASE(pass, 3, variant) KVSERVE_I8DOT_MORE_ROWS(pass, variant)                      \
        default: pass(KVSERVE_I8DOT_MAX_ROWS, variant, q, k, strip, bias, out, out_stride, width);       \
    }

static void strip_rows(int rows, int format, const quantized_row *q, int64_t k, const uint8_t *strip,
                       const float *bias, float *out, int64_t out_stride, int width) {
    if (format == GRID_Q8_Q8) {
        KVSERVE_I8DOT_ROWS(strip_pass_q8, 0)
    } else if (format == GRID_Q8H_Q8) {
        KVSERVE_I8DOT_ROWS(strip_pass_q8, 1)
    } else if (format == GRID_I4_Q8) {
        KVSERVE_I8DOT_ROWS(strip_pass, GRID_I4_Q8)
    } else if (format == GRID_Q4H_Q8) {
        KVSERVE_I8DOT_ROWS(strip_pass, GRID_Q4H_Q8)
    } else {
        KVSERVE_I8DOT_ROWS(strip_pass, GRID_Q4_Q8)
    }
}
#endif

/* Whether this build has the kernel below (AVX-512 F and BW, or AVX2 + FMA + F16C). */
int kvserve_grid_int8_dot_available(void) {
#if defined(KVSERVE_I8DOT)
    return 1;
#else
    return 0;
#endif
}

/* out [m][n] = x [m][k] times the strips `packed` in `format` (GRID_I4_Q8, GRID_Q4_Q8, GRID_Q4H_Q8, GRID_Q8_Q8
 * or GRID_Q8H_Q8),
 * with x quantized to int8 per block of 32, plus bias [n] when given. Returns nonzero where this
 * build cannot run it, the format is another, k is not a multiple of 32, or memory for the quantized
 * rows is short. */
int kvserve_grid_int8_dot_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const uint8_t *packed,
                              int format, int64_t n, const float *bias, float *out, int64_t out_stride,
                              int num_threads) {
#if defined(KVSERVE_I8DOT)
    if ((format != GRID_I4_Q8 && format != GRID_Q4_Q8 && format != GRID_Q4H_Q8 && format != GRID_Q8_Q8
         && format != GRID_Q8H_Q8) || k % KVSERVE_I8DOT_GROUP || m < 0)
        return 3;
    const int64_t groups = k / KVSERVE_I8DOT_GROUP;
    /* per row: scale, code_term and sum per block, two half sums per block, then the codes */
    char *scratch = malloc((size_t)(m * k + 5 * m * groups * (int64_t)sizeof(float) + 1));
    if (!scratch) return 5;
    float *floats = (float *)scratch;
    int8_t *codes = (int8_t *)(floats + 5 * m * groups);
    quantized_row *q = malloc((size_t)(m + 1) * sizeof(quantized_row));
    if (!q) {
        free(scratch);
        return 5;
    }
    for (int64_t r = 0; r < m; r++) {
        q[r] = (quantized_row){codes + r * k, floats + r * groups, floats + (m + r) * groups,
                               floats + (2 * m + r) * groups, floats + 3 * m * groups + 2 * r * groups};
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
