/* 16 float32 lanes for the native CPU kernels, so that each kernel is written once for both
 * vector instruction sets it runs on:
 *
 * - AVX-512: a v16 is one __m512, 32 of them fit the registers (KVSERVE_V16_REGS);
 * - AVX2 + FMA + F16C (Haswell and later, every AMD Zen): a v16 is two __m256 (lanes 0-7, 8-15),
 *   8 of them fit the 16 registers.
 *
 * Every operation does, lane by lane, what its AVX-512 instruction does (same FMA, same rounding),
 * so a kernel's per-lane arithmetic is the same bit for bit under both. The horizontal sums
 * (v16_reduce_add, v16_reduce_max_first, v16_sum_lanes16) add in the same tree order as the
 * AVX-512 code (GCC's _mm512_reduce_add_ps: upper 256 bits + lower, then upper 128 + lower, then
 * lanes {2,3} + {0,1}, then lane 1 + lane 0), so their results agree too.
 *
 * KVSERVE_VEC16 is defined where either holds; elsewhere the kernels keep their scalar paths or
 * return nonzero. */
#ifndef KVSERVE_CPU_VEC16_H
#define KVSERVE_CPU_VEC16_H

#include <stdint.h>

#define V16_INLINE static inline __attribute__((always_inline))

#if defined(__AVX512F__)
#define KVSERVE_VEC16 1
#define KVSERVE_V16_REGS 32 /* v16 values the register file holds */
#include <immintrin.h>

typedef __m512 v16;
typedef __m512i v16i; /* 16 int32 lanes */

V16_INLINE v16 v16_zero(void) { return _mm512_setzero_ps(); }
V16_INLINE v16 v16_set1(float x) { return _mm512_set1_ps(x); }
V16_INLINE v16 v16_load(const float *p) { return _mm512_loadu_ps(p); }
/* v as it is, but held in a register from here on: the compiler may not fold the load that made it
 * into each instruction that reads it (it would load it again for each). */
V16_INLINE v16 v16_in_register(v16 v) {
    __asm__("" : "+v"(v));
    return v;
}
V16_INLINE void v16_store(float *p, v16 v) { _mm512_storeu_ps(p, v); }
V16_INLINE __mmask16 v16_first_mask(int n) { return (__mmask16)((1u << n) - 1u); }
/* Lanes [0, n) from p, the rest zero (and not read). */
V16_INLINE v16 v16_load_first(const float *p, int n) { return _mm512_maskz_loadu_ps(v16_first_mask(n), p); }
/* Lanes [0, n) to p (nothing written past them). */
V16_INLINE void v16_store_first(float *p, int n, v16 v) { _mm512_mask_storeu_ps(p, v16_first_mask(n), v); }
/* Lanes [0, n) of v, the rest zero. */
V16_INLINE v16 v16_keep_first(v16 v, int n) { return _mm512_maskz_mov_ps(v16_first_mask(n), v); }
V16_INLINE v16 v16_fma(v16 a, v16 b, v16 c) { return _mm512_fmadd_ps(a, b, c); } /* a * b + c, one rounding */
V16_INLINE v16 v16_mul(v16 a, v16 b) { return _mm512_mul_ps(a, b); }
V16_INLINE v16 v16_add(v16 a, v16 b) { return _mm512_add_ps(a, b); }
V16_INLINE v16 v16_sub(v16 a, v16 b) { return _mm512_sub_ps(a, b); }
V16_INLINE v16 v16_div(v16 a, v16 b) { return _mm512_div_ps(a, b); }
V16_INLINE v16 v16_min(v16 a, v16 b) { return _mm512_min_ps(a, b); }
V16_INLINE v16 v16_max(v16 a, v16 b) { return _mm512_max_ps(a, b); }
V16_INLINE v16 v16_round(v16 a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n for integral n in [-126, 127], by the exponent bits. */
V16_INLINE v16 v16_pow2i(v16 n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
V16_INLINE v16 v16_from_i8(const int8_t *p) { /* 16 int8 values */
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
V16_INLINE v16i v16i_from_u8(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
V16_INLINE v16i v16i_shr4(v16i v) { return _mm512_srli_epi32(v, 4); }
V16_INLINE v16i v16i_low4(v16i v) { return _mm512_and_si512(v, _mm512_set1_epi32(15)); }
V16_INLINE v16 v16_from_v16i(v16i v) { return _mm512_cvtepi32_ps(v); }
/* 16 values of 4 bits from 8 bytes (byte j: lane 2j in the low nibble, 2j + 1 in the high one). */
V16_INLINE v16 v16_from_u4(const uint8_t *p) {
    const __m128i bytes = _mm_loadl_epi64((const __m128i *)p);
    const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
    const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(0x0F));
    return v16_from_v16i(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(low, high)));
}
/* Lane i: table[idx[i] & 15]. */
V16_INLINE v16 v16_lookup(v16i idx, v16 table) { return _mm512_permutexvar_ps(idx, table); }
/* Lane i: bfloat16 p[i] widened (exact). */
V16_INLINE v16 v16_from_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* Lane i: the float16 whose bits are 16-bit lane i of h (exact, subnormals included). */
V16_INLINE v16 v16_from_f16_bits(__m256i h) { return _mm512_cvtph_ps(h); }
V16_INLINE float v16_reduce_add(v16 v) { return _mm512_reduce_add_ps(v); }
/* The largest of lanes [0, n) (n >= 1). */
V16_INLINE float v16_reduce_max_first(v16 v, int n) { return _mm512_mask_reduce_max_ps(v16_first_mask(n), v); }

/* Lane t of the result: the sum of v[t]'s 16 lanes. One transpose of the 16 vectors sums them all
 * at once (45 shuffles and adds where 16 horizontal sums take ~130); each lane's sum is
 * (B0 + B1) + (B2 + B3) over its 128-bit blocks, a block's (e0 + e2) + (e1 + e3). */
V16_INLINE v16 v16_sum_lanes16(const v16 *v) {
    __m512 w[8], x[4], z[2];
    for (int j = 0; j < 8; j++)
        w[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
    for (int j = 0; j < 4; j++) /* lane group k of x[j]: tokens 4j..4j+3, summed over group k */
        x[j] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int j = 0; j < 2; j++)
        z[j] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(x[2 * j], x[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVSERVE_VEC16 1
#define KVSERVE_V16_REGS 8 /* 16 ymm registers, two a v16 */
#include <immintrin.h>

typedef struct { __m256 lo, hi; } v16;
typedef struct { __m256i lo, hi; } v16i;

V16_INLINE v16 v16_make(__m256 lo, __m256 hi) { v16 r = {lo, hi}; return r; }
V16_INLINE v16i v16i_make(__m256i lo, __m256i hi) { v16i r = {lo, hi}; return r; }
V16_INLINE v16 v16_zero(void) { return v16_make(_mm256_setzero_ps(), _mm256_setzero_ps()); }
V16_INLINE v16 v16_set1(float x) { return v16_make(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
V16_INLINE v16 v16_load(const float *p) { return v16_make(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
V16_INLINE v16 v16_in_register(v16 v) {
    __asm__("" : "+x"(v.lo), "+x"(v.hi));
    return v;
}
V16_INLINE void v16_store(float *p, v16 v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
/* All ones in lanes [0, n) of each half's mask (lanes 0-7, 8-15). */
V16_INLINE v16i v16_first_mask(int n) {
    const __m256i count = _mm256_set1_epi32(n);
    return v16i_make(_mm256_cmpgt_epi32(count, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                     _mm256_cmpgt_epi32(count, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)));
}
V16_INLINE v16 v16_load_first(const float *p, int n) {
    const v16i m = v16_first_mask(n);
    return v16_make(_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi));
}
V16_INLINE void v16_store_first(float *p, int n, v16 v) {
    const v16i m = v16_first_mask(n);
    _mm256_maskstore_ps(p, m.lo, v.lo);
    _mm256_maskstore_ps(p + 8, m.hi, v.hi);
}
V16_INLINE v16 v16_keep_first(v16 v, int n) {
    const v16i m = v16_first_mask(n);
    return v16_make(_mm256_and_ps(v.lo, _mm256_castsi256_ps(m.lo)), _mm256_and_ps(v.hi, _mm256_castsi256_ps(m.hi)));
}
V16_INLINE v16 v16_fma(v16 a, v16 b, v16 c) {
    return v16_make(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
V16_INLINE v16 v16_mul(v16 a, v16 b) { return v16_make(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
V16_INLINE v16 v16_add(v16 a, v16 b) { return v16_make(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
V16_INLINE v16 v16_sub(v16 a, v16 b) { return v16_make(_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)); }
V16_INLINE v16 v16_div(v16 a, v16 b) { return v16_make(_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)); }
V16_INLINE v16 v16_min(v16 a, v16 b) { return v16_make(_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)); }
V16_INLINE v16 v16_max(v16 a, v16 b) { return v16_make(_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)); }
V16_INLINE v16 v16_round(v16 a) {
    return v16_make(_mm256_round_ps(a.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    _mm256_round_ps(a.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
V16_INLINE __m256 v16_pow2i_half(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
V16_INLINE v16 v16_pow2i(v16 n) { return v16_make(v16_pow2i_half(n.lo), v16_pow2i_half(n.hi)); }
/* Each byte shuffled into the top of its int32 lane, then shifted down with its sign: in-lane
 * operations, where vpmovsxbd crosses the 128-bit halves (the grid strips' 8-bit codes at one row,
 * in-process A/B of two builds on a Zen 3: 0.857x; the tiles, which widen once for all their rows,
 * level at 8-64 rows). */
V16_INLINE v16 v16_from_i8(const int8_t *p) {
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    const __m256i first = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4,
                                           -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
    const __m256i second = _mm256_setr_epi8(-1, -1, -1, 8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,
                                            12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15);
    return v16_make(_mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_shuffle_epi8(bytes, first), 24)),
                    _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_shuffle_epi8(bytes, second), 24)));
}
/* The 16 bytes in both 128-bit halves, then one in-lane byte shuffle per 8 lanes: cheaper than two
 * lane-crossing widenings (vpmovzxbd) where the grid strips' code widening is the bound (their 4-bit
 * codes, in-process A/B of two builds on a Zen 3: 0.91-0.92x at one row, 0.92-0.94x at 2-4). */
V16_INLINE v16i v16i_from_u8(const uint8_t *p) {
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    const __m256i first = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1,
                                           5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i second = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1, 12, -1, -1,
                                            -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1);
    return v16i_make(_mm256_shuffle_epi8(bytes, first), _mm256_shuffle_epi8(bytes, second));
}
/* 16 values of 4 bits from 8 bytes (byte j: lane 2j in the low nibble, 2j + 1 in the high one), in
 * in-lane steps as v16i_from_u8: the 8 bytes in both 128-bit halves, each byte shuffled into the two
 * int32 lanes of its nibbles, the odd lanes shifted down 4, the low 4 bits kept. Where the codes were
 * unpacked in an xmm and widened by two lane-crossing vpmovzxbd, the grid tiles' decode steps on
 * SmolLM2 ran 0.96x at 16 rows, 0.95x at 64 (ab_decode.py's `lib` A/B on a Zen 3). */
V16_INLINE v16 v16_from_u4(const uint8_t *p) {
    const __m256i bytes = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)p));
    const __m256i first = _mm256_setr_epi8(0, -1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1,
                                           2, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1);
    const __m256i second = _mm256_setr_epi8(4, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1,
                                            6, -1, -1, -1, 7, -1, -1, -1, 7, -1, -1, -1);
    const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4), nibble = _mm256_set1_epi32(15);
    return v16_make(
        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, first), shift), nibble)),
        _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, second), shift), nibble)));
}
V16_INLINE v16i v16i_shr4(v16i v) { return v16i_make(_mm256_srli_epi32(v.lo, 4), _mm256_srli_epi32(v.hi, 4)); }
V16_INLINE v16i v16i_low4(v16i v) {
    return v16i_make(_mm256_and_si256(v.lo, _mm256_set1_epi32(15)), _mm256_and_si256(v.hi, _mm256_set1_epi32(15)));
}
V16_INLINE v16 v16_from_v16i(v16i v) { return v16_make(_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)); }
V16_INLINE v16 v16_from_bf16(const uint16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return v16_make(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16)),
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16)));
}
V16_INLINE v16 v16_from_f16_bits(__m256i h) {
    return v16_make(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
}
/* The tail of GCC's _mm512_reduce_add_ps / _mm512_mask_reduce_max_ps after their 512 -> 256 step. */
V16_INLINE float v16_reduce_add(v16 v) {
    const __m256 t3 = _mm256_add_ps(v.hi, v.lo);
    const __m128 t6 = _mm_add_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_add_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(t8) + _mm_cvtss_f32(_mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1)));
}
V16_INLINE float v16_reduce_max_first(v16 v, int n) {
    const v16i m = v16_first_mask(n);
    const __m256 low = _mm256_set1_ps(-__builtin_inff());
    const __m256 t3 = _mm256_max_ps(_mm256_blendv_ps(low, v.hi, _mm256_castsi256_ps(m.hi)),
                                    _mm256_blendv_ps(low, v.lo, _mm256_castsi256_ps(m.lo)));
    const __m128 t6 = _mm_max_ps(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3));
    const __m128 t8 = _mm_max_ps(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));
    const __m128 t10 = _mm_max_ps(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(0, 1, 0, 1)));
    return _mm_cvtss_f32(t10);
}
/* As the AVX-512 version, the same tree: the in-lane steps on each half, then the 128-bit blocks. */
V16_INLINE v16 v16_sum_lanes16(const v16 *v) {
    __m256 w_lo[8], w_hi[8], x_lo[4], x_hi[4];
    for (int j = 0; j < 8; j++) {
        w_lo[j] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * j].lo, v[2 * j + 1].lo),
                                _mm256_unpackhi_ps(v[2 * j].lo, v[2 * j + 1].lo));
        w_hi[j] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * j].hi, v[2 * j + 1].hi),
                                _mm256_unpackhi_ps(v[2 * j].hi, v[2 * j + 1].hi));
    }
    for (int j = 0; j < 4; j++) { /* x_lo[j]: tokens 4j..4j+3 summed over block 0 | over block 1; x_hi: 2 | 3 */
        x_lo[j] = _mm256_add_ps(_mm256_shuffle_ps(w_lo[2 * j], w_lo[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm256_shuffle_ps(w_lo[2 * j], w_lo[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        x_hi[j] = _mm256_add_ps(_mm256_shuffle_ps(w_hi[2 * j], w_hi[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm256_shuffle_ps(w_hi[2 * j], w_hi[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    __m256 out[2];
    for (int j = 0; j < 2; j++) { /* tokens 8j..8j+7: (B0 + B1) + (B2 + B3) */
        const __m256 b01 = _mm256_add_ps(_mm256_permute2f128_ps(x_lo[2 * j], x_lo[2 * j + 1], 0x20),
                                         _mm256_permute2f128_ps(x_lo[2 * j], x_lo[2 * j + 1], 0x31));
        const __m256 b23 = _mm256_add_ps(_mm256_permute2f128_ps(x_hi[2 * j], x_hi[2 * j + 1], 0x20),
                                         _mm256_permute2f128_ps(x_hi[2 * j], x_hi[2 * j + 1], 0x31));
        out[j] = _mm256_add_ps(b01, b23);
    }
    return v16_make(out[0], out[1]);
}
#endif

#if defined(KVSERVE_VEC16)
/* kvserve_exp (cpu_exp.h) on 16 lanes, its polynomial's steps as FMAs. */
V16_INLINE v16 v16_exp(v16 x) {
    x = v16_min(v16_max(x, v16_set1(-87.0f)), v16_set1(88.0f));
    const v16 t = v16_mul(x, v16_set1(1.44269504088896341f));
    const v16 n = v16_round(t);
    const v16 f = v16_sub(t, n);
    v16 y = v16_set1(1.5353362e-4f);
    y = v16_fma(y, f, v16_set1(1.3398874e-3f));
    y = v16_fma(y, f, v16_set1(9.6182669e-3f));
    y = v16_fma(y, f, v16_set1(5.5503406e-2f));
    y = v16_fma(y, f, v16_set1(2.4022652e-1f));
    y = v16_fma(y, f, v16_set1(6.9314718e-1f));
    y = v16_fma(y, f, v16_set1(1.0f));
    return v16_mul(y, v16_pow2i(n));
}

#endif

#endif
