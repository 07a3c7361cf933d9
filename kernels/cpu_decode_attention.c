/* Paged decode attention for the CPU, reading K/V in place through the block table (float32
 * queries and outputs; the caches float32, bfloat16 or one of the two fp8 formats, see below).
 *
 * The torch path gathers every request's context into contiguous copies each
 * layer of each step (written once, read again by SDPA): three passes over
 * the context's bytes where one suffices, and a decode step is bound by memory
 * traffic. This kernel reads each cached K and V row once, where it lies.
 * Contract as paged_decode_attention_torch:
 *
 *   query  [B, Hq, D]                 one token per request
 *   caches [num_blocks, bs, Hkv, D]   row of slot s: block s / bs, offset s % bs
 *   tables [B, table_stride] int32    block ids of request b
 *   lens   [B] int32                  context length of request b (>= 1)
 *   window                            > 0: each query sees its last `window` positions only
 *   out    [B, Hq, D]
 *
 * Each K/V row is read once for all the query heads that share it.
 * Softmax is computed online, one cache block at a time (scores of a block,
 * the block's maximum, one rescale of the accumulators per block; exp by a
 * vectorizable polynomial, since libm's expf is scalar), so the
 * kernel needs no buffer that grows with the context: everything lives on the
 * stack, bounded by the KVSERVE_MAX_* limits the caller checks.
 * With a window, a request's loop starts at its first visible position, often mid-block: the
 * blocks behind it (released by a sliding KV cache group, their table entries stale or the
 * null block) are never read, and no position is read only to be masked.
 * The caches' element format (`kv_format`, KVSERVE_KV_*): float32 rows are read as they are; the
 * others are widened to float32 as they are loaded, in registers, so a compressed cache costs memory
 * traffic in proportion to its bytes (a fp8 row of head size 64 is one cache line, a float32 row four).
 * Widening is exact for every format. The vector path widens 16 values at a time by moving bits:
 *
 *   bfloat16  b              -> float32 bits b << 16
 *   fp8 e5m2  c              -> float16 bits c << 8 (e5m2 is float16's top byte)     -> float32
 *   fp8 e4m3  c = s eeee mmm -> float16 bits s 0eeee mmm0000000 = c's value * 2^-8  -> float32
 *
 * (the float16 -> float32 step is the hardware's, AVX-512's or F16C's, subnormals included).
 * e4m3's values come out 2^-8 times too small: the scores' scale and the output's normalisation take the 256 back, exact
 * powers of two, instead of one multiply per value. A chunk's keys are widened once into a small
 * buffer for all the query heads that share them (values are read once per token anyway). The
 * scalar path reads a
 * 256-entry table of the fp8 format's values that the caller passes (torch's own conversion). The
 * fp8 scale is 1.0 per tensor (kernels/kv_quant.py); e4m3's NaN codes, which the store never writes
 * (it clamps), read as +-480 on the vector path.
 * Built by kvserve.kernels.cpu_native with -fopenmp; OpenMP here is torch's
 * own runtime (the libgomp.so.1 already loaded in the process), so the
 * region runs on the same thread team as torch's ops.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_exp.h"

#define KVSERVE_MAX_HEADS 64
#define KVSERVE_MAX_HEAD_DIM 256
#define KVSERVE_MAX_BLOCK 64
/* Rows of one context attended together (attend_rows_vec16); a longer run of them is cut. */
#define KVSERVE_MAX_GROUP_ROWS 16
/* The vector path's softmax runs over a context in partitions of this many positions, [p * 64,
 * (p + 1) * 64), each from a fresh state, folded into the row's total in order (fold_part). Fixed
 * positions, so a row's bits depend on its own context only: whether its partitions run in turn on
 * one thread or side by side on several (a step with too few rows to keep the threads busy), and
 * whatever else the step attends. */
#define KVSERVE_ATTN_PART 64

/* The caches' element formats (kernels/cpu_native.py's _KV_FORMATS). */
#define KVSERVE_KV_F32 0
#define KVSERVE_KV_BF16 1
#define KVSERVE_KV_FP8_E4M3 2
#define KVSERVE_KV_FP8_E5M2 3

static inline int64_t kv_element_bytes(int fmt) { return fmt == KVSERVE_KV_F32 ? 4 : fmt == KVSERVE_KV_BF16 ? 2 : 1; }

/* n values of a cache from element `at` on, as float32: in place for a float32 cache, else widened
 * into buf (fp8 through `values`, the format's 256 values). */
static inline const float *row_f32(const void *cache, int fmt, const float *values, int64_t at, int64_t n,
                                   float *restrict buf) {
    if (fmt == KVSERVE_KV_F32) return (const float *)cache + at;
    if (fmt == KVSERVE_KV_BF16) {
        const uint16_t *src = (const uint16_t *)cache + at;
        for (int64_t i = 0; i < n; ++i) {
            const uint32_t bits = (uint32_t)src[i] << 16;
            memcpy(buf + i, &bits, sizeof bits);
        }
        return buf;
    }
    const uint8_t *src = (const uint8_t *)cache + at;
    for (int64_t i = 0; i < n; ++i) buf[i] = values[src[i]];
    return buf;
}

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

static inline void scale_row(float *restrict x, float c, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] *= c;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

/* One request's query heads of kv heads [kv_lo, kv_hi) against its positions [begin, len), block by
 * block, each block's rows read once for all those heads (consecutive slots are `row_stride` floats
 * apart).
 * `head_dim` is a compile-time constant where attend() is inlined into a specialised caller. */
static inline void attend(const float *restrict q, const void *key_cache, const void *value_cache, int fmt,
                          const float *values, const int32_t *restrict table, int64_t begin, int64_t len,
                          float *restrict o, int64_t kv_lo, int64_t kv_hi, int64_t group, const int64_t head_dim,
                          int64_t row_stride, int64_t block_size, float scale) {
    const int64_t heads = (kv_hi - kv_lo) * group; /* query heads of this item */
    const int64_t span = (kv_hi - kv_lo) * head_dim; /* values of a slot this item reads */
    float acc[KVSERVE_MAX_HEADS * KVSERVE_MAX_HEAD_DIM];
    float row[KVSERVE_MAX_HEADS * KVSERVE_MAX_HEAD_DIM]; /* one slot's K or V widened to float32 */
    float p[KVSERVE_MAX_HEADS * KVSERVE_MAX_BLOCK]; /* p[i * KVSERVE_MAX_BLOCK + t]: head i, slot t */
    float mx[KVSERVE_MAX_HEADS], sum[KVSERVE_MAX_HEADS];
    memset(acc, 0, sizeof(float) * (size_t)(heads * head_dim));
    for (int64_t i = 0; i < heads; ++i) {
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
    }
    const float *qh = q + kv_lo * group * head_dim;
    for (int64_t start = begin, n; start < len; start += n) {
        const int64_t offset = start % block_size; /* non-zero only for a window's first block */
        n = len - start < block_size - offset ? len - start : block_size - offset;
        const int64_t first =
            ((int64_t)table[start / block_size] * block_size + offset) * row_stride + kv_lo * head_dim;
        for (int64_t t = 0; t < n; ++t) {
            const float *k = row_f32(key_cache, fmt, values, first + t * row_stride, span, row);
            for (int64_t i = 0; i < heads; ++i)
                p[i * KVSERVE_MAX_BLOCK + t] = dot(qh + i * head_dim, k + (i / group) * head_dim, head_dim) * scale;
        }
        for (int64_t i = 0; i < heads; ++i) {
            float *pi = p + i * KVSERVE_MAX_BLOCK;
            float block_max = -INFINITY;
#pragma omp simd reduction(max : block_max)
            for (int64_t t = 0; t < n; ++t) block_max = pi[t] > block_max ? pi[t] : block_max;
            const float new_max = mx[i] > block_max ? mx[i] : block_max;
            const float correction = kvserve_exp(mx[i] - new_max); /* ~0 on the first block */
            float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
            for (int64_t t = 0; t < n; ++t) {
                pi[t] = kvserve_exp(pi[t] - new_max);
                block_sum += pi[t];
            }
            sum[i] = sum[i] * correction + block_sum;
            scale_row(acc + i * head_dim, correction, head_dim);
            mx[i] = new_max;
        }
        for (int64_t t = 0; t < n; ++t) {
            const float *v = row_f32(value_cache, fmt, values, first + t * row_stride, span, row);
            for (int64_t i = 0; i < heads; ++i)
                axpy(acc + i * head_dim, p[i * KVSERVE_MAX_BLOCK + t], v + (i / group) * head_dim, head_dim);
        }
    }
    float *oh = o + kv_lo * group * head_dim;
    for (int64_t i = 0; i < heads; ++i) {
        const float inv = 1.0f / sum[i];
        for (int64_t d = 0; d < head_dim; ++d) oh[i * head_dim + d] = acc[i * head_dim + d] * inv;
    }
}

#include "cpu_vec16.h"

#if defined(KVSERVE_VEC16)
/* The vector path (cpu_vec16.h: AVX-512, or AVX2 + FMA + F16C) for the common shapes (head size 64,
 * 128 or 256 with up to 4 query heads per kv head). A token's dot products leave 16 partial sums each; one transpose of 16 such
 * vectors sums them all at once (45 shuffles and adds where 16 horizontal sums take ~130). A
 * 16-token chunk's rows are read once, front to back, for all the item's kv heads, while the
 * next chunk's are prefetched; one kv head's query heads keep their accumulators in registers
 * through the chunk. A 16-request step at 320 tokens of context (SmolLM2's 30 layers, 236 MB of
 * K/V): 3.3-3.6 ms against the scalar loops' 5.3-7.2 with the cache resident, 11.6-14.5 ms
 * against 23.9-26.5 with its blocks scattered through memory (as a long-running server's are);
 * with the blocks in order both wait on memory (~10-11 ms in the engine). Under AVX2 the same code
 * spills more of its accumulators (16 registers of 8 lanes), and still runs 1.3-2.1x the scalar
 * loops on a 2-core EPYC (head sizes 64-256, float32 and bfloat16 caches). */

/* 16 cache values from element `at` on, widened to float32 (see the file's comment; e4m3's come out
 * as value * 2^-8, E4M3_UNIT). */
static inline __attribute__((always_inline)) v16 load16(const int FMT, const void *cache, int64_t at) {
    if (FMT == KVSERVE_KV_F32) return v16_load((const float *)cache + at);
    if (FMT == KVSERVE_KV_BF16) return v16_from_bf16((const uint16_t *)cache + at);
    const __m256i top = _mm256_slli_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)((const uint8_t *)cache + at))), 8);
    if (FMT == KVSERVE_KV_FP8_E5M2) return v16_from_f16_bits(top);
    /* s eeee mmm 00000000 -> s s eeee mmm 0000000 (arithmetic shift) -> s 0 eeee mmm 0000000 */
    return v16_from_f16_bits(_mm256_and_si256(_mm256_srai_epi16(top, 1), _mm256_set1_epi16((short)0xbfff)));
}

/* What load16's values are in units of: e4m3's are 2^-8 of theirs. */
#define E4M3_UNIT 256.0f

/* Tokens of the chunk at t0: up to chunk_max, within t0's cache block and partition, before len. */
static inline int chunk_len(int64_t t0, int64_t len, int64_t chunk_max, int64_t block_size) {
    int64_t n = block_size - t0 % block_size;
    n = n < chunk_max ? n : chunk_max;
    const int64_t to_part = KVSERVE_ATTN_PART - t0 % KVSERVE_ATTN_PART; /* never less: block sizes divide it */
    n = n < to_part ? n : to_part;
    return (int)(len - t0 < n ? len - t0 : n);
}

/* Fresh softmax states for h query heads of NV vectors each. */
static inline void fresh_state(int64_t h, int64_t head_dim, float *restrict mx, float *restrict sum,
                               float *restrict acc) {
    memset(acc, 0, sizeof(float) * (size_t)(h * head_dim));
    for (int64_t i = 0; i < h; i++) {
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
    }
}

/* Folds one partition's state of h query heads (pmx, psum, pacc) into their running total (mx, sum,
 * acc), both on the scale of their own maxima. Folded into a fresh total, a partition's state comes
 * out bit for bit (exp(-inf) is ~1e-38 times zeros; exp(0) is exactly 1). */
static inline __attribute__((always_inline)) void fold_part(const int NV, int64_t h, float *restrict mx,
                                                            float *restrict sum, float *restrict acc,
                                                            const float *restrict pmx, const float *restrict psum,
                                                            const float *restrict pacc) {
    for (int64_t i = 0; i < h; i++) {
        const float m = mx[i] > pmx[i] ? mx[i] : pmx[i];
        const float keep = kvserve_exp(mx[i] - m), take = kvserve_exp(pmx[i] - m);
        sum[i] = sum[i] * keep + psum[i] * take;
        mx[i] = m;
        for (int j = 0; j < NV; j++) {
            float *a = acc + (i * NV + j) * 16;
            const v16 kept = v16_mul(v16_load(a), v16_set1(keep));
            v16_store(a, v16_fma(v16_load(pacc + (i * NV + j) * 16), v16_set1(take), kept));
        }
    }
}

/* Bytes [lo, hi) of each of the first n rows of the next chunk's K and V (rows row_bytes apart),
 * which attend_chunk asks for into L2 a token at a time while it sums this chunk's values. Asked for
 * all at once before the chunk, as before, they overlapped nothing measurable (BENCHMARKS.md
 * section 7, fourteenth and seventeenth points); spread through the arithmetic, a 16-request step's
 * attention ran 0.785x and a batch-1 step's at 1,000 tokens 0.943x (weights streamed between layers
 * included), with the same bits, and the offline C=16 workload 1.024x. key == NULL: none. */
typedef struct {
    const char *key, *value;
    int64_t row_bytes;
    int n, lo, hi;
} next_rows;
static const next_rows NO_NEXT_ROWS = {0, 0, 0, 0, 0, 0};

/* The rows of the chunk at position t1 (up to position `end`) from kv head kv_lo on, or none at end. */
static inline next_rows next_chunk_rows(const void *key_cache, const void *value_cache, int64_t bytes,
                                        const int32_t *table, int64_t block_size, int64_t row_stride, int64_t first_col,
                                        int64_t t1, int64_t end, int64_t chunk_max) {
    if (t1 >= end) return NO_NEXT_ROWS;
    const int64_t at = ((int64_t)table[t1 / block_size] * block_size + t1 % block_size) * row_stride + first_col;
    return (next_rows){(const char *)key_cache + at * bytes, (const char *)value_cache + at * bytes, row_stride * bytes,
                       chunk_len(t1, end, chunk_max, block_size), 0, 0};
}

/* Kv head j of `heads` asks for its share of the `lines` cache lines of each row. */
static inline void share_lines(next_rows *next, int64_t lines, int64_t j, int64_t heads) {
    next->lo = (int)(lines * j / heads * 64);
    next->hi = (int)(lines * (j + 1) / heads * 64);
}

/* One chunk of n tokens into the running softmax of one kv head's G query heads (NV vectors of 16
 * per head row): their queries at q, their state mx[G], sum[G] and acc[G * NV * 16]. The chunk's
 * keys are float32 (in load16's unit) at kf, token t's at kf + t * k_stride; its values are read
 * from element v_first of value_cache on, token t's row_stride elements after token t - 1's. Every
 * (query head, token) takes the same operations in the same order whatever else the caller
 * attends, so a query's output has the same bits alone or beside others. While it sums the values
 * it asks for `next`'s rows (nothing it reads). */
static inline __attribute__((always_inline)) void attend_chunk(
    const int FMT, const int NV, const int G, const float *restrict q, const float *restrict kf, int64_t k_stride,
    const void *value_cache, int64_t v_first, int64_t row_stride, int n, v16 score_scale, float *restrict mx,
    float *restrict sum, float *restrict acc, next_rows next) {
    const int64_t head_dim = NV * 16;
    float p[4][16];
    /* [G][NV]: G <= 4, NV <= 16. At NV 16 (head size 256, Gemma 3's) the G x 16 accumulators
     * outnumber AVX-512's 32 registers and live in L1, which still beats the scalar loops ~2x. */
    v16 a[4][16];
    for (int i = 0; i < G; i++) {
        v16 part[16];
        if (n == 16) { /* a whole chunk: unrolled, so that the tokens' FMA chains interleave */
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) {
                v16 dot = v16_zero();
                for (int j = 0; j < NV; j++)
                    dot = v16_fma(v16_load(q + i * head_dim + j * 16), v16_load(kf + t * k_stride + j * 16), dot);
                part[t] = dot;
            }
        } else {
            for (int t = 0; t < 16; t++) {
                v16 dot = v16_zero();
                if (t < n)
                    for (int j = 0; j < NV; j++)
                        dot = v16_fma(v16_load(q + i * head_dim + j * 16), v16_load(kf + t * k_stride + j * 16), dot);
                part[t] = dot;
            }
        }
        const v16 scores = v16_mul(v16_sum_lanes16(part), score_scale);
        const float top = v16_reduce_max_first(scores, n);
        const float new_max = mx[i] > top ? mx[i] : top;
        const float correction = kvserve_exp(mx[i] - new_max); /* ~0 on the first chunk */
        const v16 e = v16_keep_first(v16_exp(v16_sub(scores, v16_set1(new_max))), n);
        v16_store(p[i], e);
        sum[i] = sum[i] * correction + v16_reduce_add(e);
        mx[i] = new_max;
        const v16 c = v16_set1(correction);
        for (int j = 0; j < NV; j++) a[i][j] = v16_mul(v16_load(acc + i * head_dim + j * 16), c);
    }
    for (int t = 0; t < n; t++) {
        if (next.key && t < next.n)
            for (int f = next.lo; f < next.hi; f += 64) { /* a cache line at a time; never faults */
                _mm_prefetch(next.key + t * next.row_bytes + f, _MM_HINT_T1);
                _mm_prefetch(next.value + t * next.row_bytes + f, _MM_HINT_T1);
            }
        v16 vv[16];
        /* a token's values loaded once for the G heads, where they and the accumulators fit the registers */
        for (int j = 0; j < NV; j++) {
            vv[j] = load16(FMT, value_cache, v_first + t * row_stride + j * 16);
            if (NV * (G + 1) < KVSERVE_V16_REGS) vv[j] = v16_in_register(vv[j]);
        }
        for (int i = 0; i < G; i++) {
            const v16 pt = v16_set1(p[i][t]);
            for (int j = 0; j < NV; j++) a[i][j] = v16_fma(pt, vv[j], a[i][j]);
        }
    }
    for (int i = 0; i < G; i++)
        for (int j = 0; j < NV; j++) v16_store(acc + i * head_dim + j * 16, a[i][j]);
}

/* The float32 keys of the chunk of n tokens whose kv head's row in its first slot is element
 * kv_first: in place for a float32 cache (token t's at *k_stride elements apart), else widened into
 * kbuf ([token][head_dim]). */
static inline __attribute__((always_inline)) const float *chunk_keys(const int FMT, const int NV, const void *key_cache,
                                                                     int64_t kv_first, int64_t row_stride, int n,
                                                                     float *restrict kbuf, int64_t *k_stride) {
    if (FMT == KVSERVE_KV_F32) {
        *k_stride = row_stride;
        return (const float *)key_cache + kv_first;
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < NV; j++)
            v16_store(kbuf + t * NV * 16 + j * 16, load16(FMT, key_cache, kv_first + t * row_stride + j * 16));
    *k_stride = NV * 16;
    return kbuf;
}

/* A row's output for one kv head's G query heads from its folded total (acc in units of `unit`). */
static inline __attribute__((always_inline)) void store_rows_out(float unit, const int NV, const int G,
                                                                 const float *restrict sum, const float *restrict acc,
                                                                 float *restrict o) {
    for (int i = 0; i < G; i++) {
        const v16 inv = v16_set1(unit / sum[i]);
        for (int j = 0; j < NV; j++)
            v16_store(o + i * NV * 16 + j * 16, v16_mul(v16_load(acc + i * NV * 16 + j * 16), inv));
    }
}

/* Loads every cache line of the m consecutive slots from element `at` on, in address order, where
 * the caller reads whole rows (span == row_bytes); nothing for a kv head's slice of each. The
 * attention's own loads then find them in the cache. Read this way, memory serves a chunk's rows
 * faster than in the attention's own order (a kv head's keys, its values, the next kv head's) or to
 * prefetch instructions for the same lines: float32, batch 1 at 1,000 tokens ~0.8x, 16 requests at
 * 320 tokens ~0.8x (BENCHMARKS.md section 7, fourteenth point). Slices touched were 1.1x slower. */
static inline void touch_rows(const void *key_cache, const void *value_cache, int64_t bytes, int64_t at, int m,
                              int64_t span, int64_t row_bytes) {
    if (span != row_bytes) return;
    const char *key_bytes = (const char *)key_cache + at * bytes, *value_bytes = (const char *)value_cache + at * bytes;
    int32_t sink = 0;
    for (int64_t f = 0; f < m * row_bytes; f += 64)
        sink += *(const volatile int32_t *)(key_bytes + f) + *(const volatile int32_t *)(value_bytes + f);
    (void)sink;
}

/* Query heads [kv_lo * G, kv_hi * G) of one request (NV vectors of 16 per head row) against its
 * positions [begin, len), 16 tokens at a time: each chunk's rows are read once, front to back, for
 * all those kv heads, while the next chunk's are asked for through the arithmetic (next_rows). One
 * kv head's G query heads keep their accumulators in registers through the chunk. Each partition
 * (KVSERVE_ATTN_PART) starts from a fresh state and is folded into the total at its end. */
static inline __attribute__((always_inline)) void attend_vec16(
    const int FMT, const int NV, const int G, const float *restrict q, const void *key_cache,
    const void *value_cache, const int32_t *restrict table, int64_t begin, int64_t len, float *restrict o,
    int64_t kv_lo, int64_t kv_hi, int64_t row_stride, int64_t block_size, float scale) {
    const int64_t bytes = kv_element_bytes(FMT);
    const int64_t head_dim = NV * 16;
    const int64_t heads = (kv_hi - kv_lo) * G;
    float acc[KVSERVE_MAX_HEADS * KVSERVE_MAX_HEAD_DIM], mx[KVSERVE_MAX_HEADS], sum[KVSERVE_MAX_HEADS]; /* partition */
    float tacc[KVSERVE_MAX_HEADS * KVSERVE_MAX_HEAD_DIM], tmx[KVSERVE_MAX_HEADS], tsum[KVSERVE_MAX_HEADS]; /* total */
    fresh_state(heads, head_dim, mx, sum, acc);
    fresh_state(heads, head_dim, tmx, tsum, tacc);
    const float *qh = q + kv_lo * G * head_dim;
    float *oh = o + kv_lo * G * head_dim;
    const int64_t span = (kv_hi - kv_lo) * head_dim * bytes; /* bytes of a slot this item reads */
    /* Chunks of up to 16 tokens that stay within one cache block (consecutive slots); a window
     * starting mid-block makes the chunks of its first block end at the block's end, not 16 apart. */
    const int64_t chunk_max = block_size < 16 ? block_size : 16;
    const float unit = FMT == KVSERVE_KV_FP8_E4M3 ? E4M3_UNIT : 1.0f;
    const v16 score_scale = v16_set1(scale * unit);
    float kbuf[16 * 16 * 16]; /* a chunk's keys of one kv head widened: [token][NV * 16] */
    for (int64_t t0 = begin, n; t0 < len; t0 += n) {
        if (t0 > begin && t0 % KVSERVE_ATTN_PART == 0) { /* a partition ends */
            fold_part(NV, heads, tmx, tsum, tacc, mx, sum, acc);
            fresh_state(heads, head_dim, mx, sum, acc);
        }
        n = chunk_len(t0, len, chunk_max, block_size);
        const int64_t first =
            ((int64_t)table[t0 / block_size] * block_size + t0 % block_size) * row_stride + kv_lo * head_dim;
        const int64_t t1 = t0 + n;
        touch_rows(key_cache, value_cache, bytes, first, (int)n, span, row_stride * bytes);
        /* The next chunk's rows are asked for through this chunk's kv heads, each its share of a row's lines. */
        next_rows next = next_chunk_rows(key_cache, value_cache, bytes, table, block_size, row_stride,
                                         kv_lo * head_dim, t1, len, chunk_max);
        const int64_t kv_heads = kv_hi - kv_lo, lines = (span + 63) / 64;
        for (int64_t kv = 0; kv < kv_heads; kv++) {
            const int64_t kv_first = first + kv * head_dim; /* this kv head's row in the chunk's first slot */
            int64_t k_stride;
            const float *kf = chunk_keys(FMT, NV, key_cache, kv_first, row_stride, (int)n, kbuf, &k_stride);
            share_lines(&next, lines, kv, kv_heads);
            attend_chunk(FMT, NV, G, qh + kv * G * head_dim, kf, k_stride, value_cache, kv_first, row_stride, (int)n,
                         score_scale, mx + kv * G, sum + kv * G, acc + kv * G * head_dim, next);
        }
    }
    if (len > begin) fold_part(NV, heads, tmx, tsum, tacc, mx, sum, acc);
    for (int64_t kv = 0; kv < kv_hi - kv_lo; kv++)
        store_rows_out(unit, NV, G, tsum + kv * G, tacc + kv * G * head_dim, oh + kv * G * head_dim);
}

/* Rows that read one context: the query rows [0, rows) of a request verifying proposals or of a
 * prompt chunk (each row's query at q + r * q_stride, length lens[r], all from position 0), against
 * kv heads [kv_lo, kv_hi), over the positions [p0, p1) of one partition (p0 > 0: a window's start, for
 * one row). Row r's state for kv head kv_lo + j over [p0, min(p1, lens[r])), from fresh, is state
 * s = j * kv_state + r: mx[s * G], sum[s * G] and acc[s * G * head_dim] (left fresh where the row ends
 * before p0). A chunk's kv heads are attended in turn, so its cache rows are read whole. Each chunk's
 * keys and values come from memory once, for the first row that reads them; the other rows find them
 * in L1. Row r takes attend_vec16's operations on its own query in the same order, so its output has
 * the same bits as alone in a plain decode step. Prefetches run up to prefetch_end. */
static inline __attribute__((always_inline)) void attend_rows_part(
    const int FMT, const int NV, const int G, const float *restrict q, const int32_t *restrict lens, int64_t rows,
    int64_t q_stride, const void *key_cache, const void *value_cache, const int32_t *restrict table, int64_t kv_lo,
    int64_t kv_hi, int64_t kv_state, int64_t row_stride, int64_t block_size, float scale, int64_t p0, int64_t p1,
    int64_t prefetch_end, float *restrict mx, float *restrict sum, float *restrict acc) {
    const int64_t bytes = kv_element_bytes(FMT);
    const int64_t head_dim = NV * 16;
    int64_t len = p0;
    for (int64_t r = 0; r < rows; r++) len = lens[r] > len ? lens[r] : len;
    for (int64_t kv = 0; kv < kv_hi - kv_lo; kv++)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t s = kv * kv_state + r;
            fresh_state(G, head_dim, mx + s * G, sum + s * G, acc + s * G * head_dim);
        }
    len = len < p1 ? len : p1;
    const int64_t chunk_max = block_size < 16 ? block_size : 16;
    const float unit = FMT == KVSERVE_KV_FP8_E4M3 ? E4M3_UNIT : 1.0f;
    const v16 score_scale = v16_set1(scale * unit);
    float kbuf[16 * 16 * 16];
    for (int64_t t0 = p0, n; t0 < len; t0 += n) {
        n = chunk_len(t0, len, chunk_max, block_size);
        const int64_t slot = (int64_t)table[t0 / block_size] * block_size + t0 % block_size;
        const int64_t t1 = t0 + n, span = (kv_hi - kv_lo) * head_dim * bytes;
        touch_rows(key_cache, value_cache, bytes, slot * row_stride + kv_lo * head_dim, (int)n, span,
                   row_stride * bytes);
        /* The next chunk's rows (up to prefetch_end) are asked for through the last row's arithmetic,
         * the longest in a verification's or a prompt chunk's rows, each kv head its share of the lines. */
        next_rows next = next_chunk_rows(key_cache, value_cache, bytes, table, block_size, row_stride,
                                         kv_lo * head_dim, t1, prefetch_end, chunk_max);
        const int64_t kv_heads = kv_hi - kv_lo, lines = (span + 63) / 64;
        for (int64_t kv = kv_lo; kv < kv_hi; kv++) {
            const int64_t kv_first = slot * row_stride + kv * head_dim;
            int64_t k_stride;
            const float *kf = chunk_keys(FMT, NV, key_cache, kv_first, row_stride, (int)n, kbuf, &k_stride);
            share_lines(&next, lines, kv - kv_lo, kv_heads);
            for (int64_t r = 0; r < rows; r++) {
                /* a row's chunks are attend_vec16's for its own length: this one, cut at its end */
                const int64_t m = lens[r] - t0 < n ? lens[r] - t0 : n;
                const int64_t s = (kv - kv_lo) * kv_state + r;
                if (m > 0)
                    attend_chunk(FMT, NV, G, q + r * q_stride + kv * G * head_dim, kf, k_stride, value_cache, kv_first,
                                 row_stride, (int)m, score_scale, mx + s * G, sum + s * G, acc + s * G * head_dim,
                                 r == rows - 1 ? next : NO_NEXT_ROWS);
            }
        }
    }
}

/* The rows [0, rows) of one context (lens[r] each, from position 0; outputs at o + r * q_stride)
 * against one kv head, partition after partition on this thread: a row's partitions are folded in
 * order, as the split path (kvserve_paged_decode) folds them. */
static inline __attribute__((always_inline)) void attend_rows_vec16(
    const int FMT, const int NV, const int G, const float *restrict q, const int32_t *restrict lens, int64_t rows,
    int64_t q_stride, const void *key_cache, const void *value_cache, const int32_t *restrict table,
    float *restrict o, int64_t kv, int64_t row_stride, int64_t block_size, float scale) {
    const int64_t head_dim = NV * 16;
    /* row r's G heads at r * G (mx, sum) and r * G * head_dim (acc): this partition's, and the folded ones' */
    float acc[KVSERVE_MAX_GROUP_ROWS * 4 * KVSERVE_MAX_HEAD_DIM], mx[KVSERVE_MAX_GROUP_ROWS * 4],
        sum[KVSERVE_MAX_GROUP_ROWS * 4];
    float tacc[KVSERVE_MAX_GROUP_ROWS * 4 * KVSERVE_MAX_HEAD_DIM], tmx[KVSERVE_MAX_GROUP_ROWS * 4],
        tsum[KVSERVE_MAX_GROUP_ROWS * 4];
    int64_t len = 0;
    for (int64_t r = 0; r < rows; r++) {
        fresh_state(G, head_dim, tmx + r * G, tsum + r * G, tacc + r * G * head_dim);
        len = lens[r] > len ? lens[r] : len;
    }
    for (int64_t p0 = 0; p0 < len; p0 += KVSERVE_ATTN_PART) {
        attend_rows_part(FMT, NV, G, q, lens, rows, q_stride, key_cache, value_cache, table, kv, kv + 1, 0,
                         row_stride, block_size, scale, p0, p0 + KVSERVE_ATTN_PART, len, mx, sum, acc);
        for (int64_t r = 0; r < rows; r++)
            if (lens[r] > p0)
                fold_part(NV, G, tmx + r * G, tsum + r * G, tacc + r * G * head_dim, mx + r * G, sum + r * G,
                          acc + r * G * head_dim);
    }
    for (int64_t r = 0; r < rows; r++)
        store_rows_out(FMT == KVSERVE_KV_FP8_E4M3 ? E4M3_UNIT : 1.0f, NV, G, tsum + r * G, tacc + r * G * head_dim,
                       o + r * q_stride + kv * G * head_dim);
}

#define ATTEND_VEC16(FMT, NV, G)                                                                                 \
    static void attend_vec16_##FMT##_##NV##_##G(const float *q, const void *kc, const void *vc,                  \
                                                 const int32_t *table, int64_t begin, int64_t len, float *o,       \
                                                 int64_t lo, int64_t hi, int64_t row_stride, int64_t block_size,   \
                                                 float scale) {                                                    \
        attend_vec16(FMT, NV, G, q, kc, vc, table, begin, len, o, lo, hi, row_stride, block_size, scale);        \
    }                                                                                                            \
    static void attend_rows_vec16_##FMT##_##NV##_##G(const float *q, const int32_t *lens, int64_t rows,         \
                                                      int64_t q_stride, const void *kc, const void *vc,           \
                                                      const int32_t *table, float *o, int64_t kv,                 \
                                                      int64_t row_stride, int64_t block_size, float scale) {      \
        attend_rows_vec16(FMT, NV, G, q, lens, rows, q_stride, kc, vc, table, o, kv, row_stride, block_size,     \
                          scale);                                                                                \
    }                                                                                                            \
    static void attend_rows_part_##FMT##_##NV##_##G(                                                             \
        const float *q, const int32_t *lens, int64_t rows, int64_t q_stride, const void *kc, const void *vc,     \
        const int32_t *table, int64_t kv_lo, int64_t kv_hi, int64_t kv_state, int64_t row_stride,               \
        int64_t block_size, float scale, int64_t p0, int64_t p1, int64_t prefetch_end, float *mx, float *sum,    \
        float *acc) {                                                                                            \
        attend_rows_part(FMT, NV, G, q, lens, rows, q_stride, kc, vc, table, kv_lo, kv_hi, kv_state, row_stride, \
                         block_size, scale, p0, p1, prefetch_end, mx, sum, acc);                                 \
    }
#define ATTEND_VEC16_SHAPES(FMT) \
    ATTEND_VEC16(FMT, 4, 1)      \
    ATTEND_VEC16(FMT, 4, 2)      \
    ATTEND_VEC16(FMT, 4, 3)      \
    ATTEND_VEC16(FMT, 4, 4)      \
    ATTEND_VEC16(FMT, 8, 1)      \
    ATTEND_VEC16(FMT, 8, 2)      \
    ATTEND_VEC16(FMT, 8, 3)      \
    ATTEND_VEC16(FMT, 8, 4)      \
    ATTEND_VEC16(FMT, 16, 1)     \
    ATTEND_VEC16(FMT, 16, 2)     \
    ATTEND_VEC16(FMT, 16, 3)     \
    ATTEND_VEC16(FMT, 16, 4)
ATTEND_VEC16_SHAPES(0)
ATTEND_VEC16_SHAPES(1)
ATTEND_VEC16_SHAPES(2)
ATTEND_VEC16_SHAPES(3)

typedef void (*attend_fn)(const float *, const void *, const void *, const int32_t *, int64_t, int64_t, float *,
                          int64_t, int64_t, int64_t, int64_t, float);
typedef void (*attend_rows_fn)(const float *, const int32_t *, int64_t, int64_t, const void *, const void *,
                               const int32_t *, float *, int64_t, int64_t, int64_t, float);
typedef void (*attend_part_fn)(const float *, const int32_t *, int64_t, int64_t, const void *, const void *,
                               const int32_t *, int64_t, int64_t, int64_t, int64_t, int64_t, float, int64_t, int64_t,
                               int64_t, float *, float *, float *);

/* Index of the specialised kernels for this format, head size and group, or -1 (the scalar loops run). */
static int vec16_shape(int fmt, int64_t head_dim, int64_t group) {
    if (fmt < 0 || fmt > 3 || group < 1 || group > 4) return -1;
    const int by_dim = head_dim == 64 ? 0 : head_dim == 128 ? 1 : head_dim == 256 ? 2 : -1;
    return by_dim < 0 ? -1 : fmt * 12 + by_dim * 4 + (int)group - 1;
}

#define KERNELS_OF(NAME, FMT)                                                                         \
    NAME##_##FMT##_4_1, NAME##_##FMT##_4_2, NAME##_##FMT##_4_3, NAME##_##FMT##_4_4, NAME##_##FMT##_8_1, \
        NAME##_##FMT##_8_2, NAME##_##FMT##_8_3, NAME##_##FMT##_8_4, NAME##_##FMT##_16_1, NAME##_##FMT##_16_2, \
        NAME##_##FMT##_16_3, NAME##_##FMT##_16_4
static const attend_fn vec16_kernels[48] = {KERNELS_OF(attend_vec16, 0), KERNELS_OF(attend_vec16, 1),
                                            KERNELS_OF(attend_vec16, 2), KERNELS_OF(attend_vec16, 3)};
static const attend_rows_fn vec16_rows_kernels[48] = {
    KERNELS_OF(attend_rows_vec16, 0), KERNELS_OF(attend_rows_vec16, 1), KERNELS_OF(attend_rows_vec16, 2),
    KERNELS_OF(attend_rows_vec16, 3)};
static const attend_part_fn vec16_part_kernels[48] = {
    KERNELS_OF(attend_rows_part, 0), KERNELS_OF(attend_rows_part, 1), KERNELS_OF(attend_rows_part, 2),
    KERNELS_OF(attend_rows_part, 3)};
#undef KERNELS_OF
#endif

#define ATTEND_WITH_HEAD_DIM(D)                                                                                  \
    static void attend_##D(const float *q, const void *kc, const void *vc, int fmt, const float *values,          \
                           const int32_t *table, int64_t begin, int64_t len, float *o, int64_t lo, int64_t hi,    \
                           int64_t group, int64_t row_stride, int64_t block_size, float scale) {                 \
        attend(q, kc, vc, fmt, values, table, begin, len, o, lo, hi, group, D, row_stride, block_size, scale);  \
    }
ATTEND_WITH_HEAD_DIM(64)
ATTEND_WITH_HEAD_DIM(128)

/* The first position a query at length len sees: its window's start, or 0. */
static inline int64_t first_visible(int64_t len, int64_t window) { return window > 0 && len > window ? len - window : 0; }

#if defined(KVSERVE_VEC16)
/* Whether rows a and b read one context from position 0: the same block table (a request's verify
 * rows are copies of its table) and no window that starts either of them later. */
static int same_context(const int32_t *tables, int64_t table_stride, const int32_t *lens, int64_t window, int64_t a,
                        int64_t b) {
    if (first_visible(lens[a], window) || first_visible(lens[b], window)) return 0;
    return memcmp(tables + a * table_stride, tables + b * table_stride, sizeof(int32_t) * (size_t)table_stride) == 0;
}

/* A run's cost, and the run. */
typedef struct {
    int64_t cost, run;
} costed_run;

static int costlier_first(const void *a, const void *b) {
    const costed_run *x = a, *y = b;
    return x->cost != y->cost ? (x->cost > y->cost ? -1 : 1) : (x->run > y->run) - (x->run < y->run);
}

/* Into order[0, runs): the order in which the threads take runs [0, runs) (run i: rows [starts[i],
 * starts[i + 1])) as they come free, the costliest first, so that what is left at the end is short.
 * A run's cost, in row positions: each row attends its positions (a lone row from its window's
 * start), and the run reads its longest row's from memory once, ~3 row positions' worth (16 single
 * rows at 320 tokens took 2.6 us a position, the rows of a 256-token prompt chunk, which find a chunk
 * in L1 after the first row, 0.7 us: SmolLM2, scattered blocks). In the rows' own order a prompt
 * chunk's runs come shortest first, and an even split by count left one thread three quarters of a
 * 256-token chunk's work. Which thread runs a run does not change its bits. */
static void costliest_first(const int64_t *starts, const int32_t *lens, int64_t window, int64_t runs,
                            int64_t *order) {
    costed_run costed[runs];
    for (int64_t i = 0; i < runs; i++) {
        const int64_t b = starts[i], end = starts[i + 1];
        int64_t positions = 0, longest = 0;
        for (int64_t r = b; r < end; r++) {
            const int64_t n = lens[r] - (end - b == 1 ? first_visible(lens[r], window) : 0);
            positions += n;
            longest = n > longest ? n : longest;
        }
        costed[i] = (costed_run){positions + 3 * longest, i};
    }
    qsort(costed, (size_t)runs, sizeof(costed_run), costlier_first);
    for (int64_t i = 0; i < runs; i++) order[i] = costed[i].run;
}

/* The rows as runs of consecutive rows that read one context (at most KVSERVE_MAX_GROUP_ROWS each):
 * run i is rows [starts[i], starts[i + 1]). Returns the number of runs. */
static int64_t context_runs(const int32_t *tables, int64_t table_stride, const int32_t *lens, int64_t window,
                            int64_t batch, int64_t *starts) {
    int64_t runs = 0;
    for (int64_t b = 0; b < batch; b++)
        if (b == 0 || b - starts[runs - 1] == KVSERVE_MAX_GROUP_ROWS ||
            !same_context(tables, table_stride, lens, window, b - 1, b))
            starts[runs++] = b;
    starts[runs] = batch;
    return runs;
}

/* The first position of partition `part` that a context starting at `begin` attends. */
static inline int64_t part_start(int64_t part, int64_t begin) {
    return part * KVSERVE_ATTN_PART > begin ? part * KVSERVE_ATTN_PART : begin;
}

/* Too few runs to keep the threads busy (a step of one or a few requests): each run's context is
 * cut into its partitions, a work item each with every kv head, whose states go to a buffer; then
 * each (row, kv head) folds its partitions in order and writes its output. The same partitions and
 * folds as on one thread, so the same bits; no context is read twice. An item reads whole cache
 * rows: (kv head, partition) items each read a slice of every row, which memory serves slower
 * (batch 1 at 1,000 tokens 0.84x whole, BENCHMARKS.md section 7, fourteenth point). Returns nonzero
 * where the buffer could not be had (the caller runs the unsplit path). */
static int attend_split(int shape, int kv_format, const float *query, const void *key_cache, const void *value_cache,
                        const int32_t *tables, int64_t table_stride, const int32_t *lens, float *out, int64_t batch,
                        int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t window,
                        float scale, int num_threads, const int64_t *starts, int64_t runs) {
    const attend_part_fn part = vec16_part_kernels[shape];
    const int64_t group = num_heads / num_kv_heads, q_stride = num_heads * head_dim;
    const int64_t row_stride = num_kv_heads * head_dim, P = KVSERVE_ATTN_PART;
    /* run i: its positions [begin[i], end[i]) (a window starts only a one-row run), partitions first[i]
     * on, parts[i] of them; its items (a partition with every kv head) from item_at[i] on; its states
     * from state_at[i] on ([kv head][partition][row] of G query heads each) */
    int64_t begin[runs], end[runs], first[runs], parts[runs], item_at[runs + 1], state_at[runs + 1];
    item_at[0] = state_at[0] = 0;
    for (int64_t i = 0; i < runs; i++) {
        const int64_t rows = starts[i + 1] - starts[i];
        end[i] = 0;
        for (int64_t b = starts[i]; b < starts[i + 1]; b++) end[i] = lens[b] > end[i] ? lens[b] : end[i];
        begin[i] = rows == 1 ? first_visible(lens[starts[i]], window) : 0;
        first[i] = begin[i] / P;
        parts[i] = (end[i] - 1) / P - first[i] + 1;
        item_at[i + 1] = item_at[i] + parts[i];
        state_at[i + 1] = state_at[i] + num_kv_heads * parts[i] * rows;
    }
    float *buf = malloc(sizeof(float) * (size_t)(state_at[runs] * group * (2 + head_dim)));
    if (!buf) return 1;
    float *mxs = buf, *sums = mxs + state_at[runs] * group, *accs = sums + state_at[runs] * group;
    const float unit = kv_format == KVSERVE_KV_FP8_E4M3 ? E4M3_UNIT : 1.0f;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t item = 0; item < item_at[runs]; item++) {
            int64_t i = 0;
            while (item >= item_at[i + 1]) i++;
            const int64_t p = item - item_at[i], b = starts[i], rows = starts[i + 1] - b, s = state_at[i] + p * rows;
            const int64_t p0 = part_start(first[i] + p, begin[i]), p1 = (first[i] + p + 1) * P;
            part(query + b * q_stride, lens + b, rows, q_stride, key_cache, value_cache, tables + b * table_stride, 0,
                 num_kv_heads, parts[i] * rows, row_stride, block_size, scale, p0, p1, p1 < end[i] ? p1 : end[i],
                 mxs + s * group, sums + s * group, accs + s * group * head_dim);
        }
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < batch * num_kv_heads; pair++) {
            const int64_t b = pair / num_kv_heads, kv = pair % num_kv_heads;
            int64_t i = 0;
            while (b >= starts[i + 1]) i++;
            const int64_t rows = starts[i + 1] - starts[i], r = b - starts[i];
            float tacc[4 * KVSERVE_MAX_HEAD_DIM], tmx[4], tsum[4];
            fresh_state(group, head_dim, tmx, tsum, tacc);
            for (int64_t p = 0; p < parts[i]; p++) {
                if (lens[b] <= part_start(first[i] + p, begin[i])) break; /* the row ends before this partition */
                const int64_t s = state_at[i] + (kv * parts[i] + p) * rows + r;
                fold_part((int)(head_dim / 16), group, tmx, tsum, tacc, mxs + s * group, sums + s * group,
                          accs + s * group * head_dim);
            }
            store_rows_out(unit, (int)(head_dim / 16), (int)group, tsum, tacc,
                           out + b * q_stride + kv * group * head_dim);
        }
    }
    free(buf);
    return 0;
}
#endif

/* Returns 0, or -1 when the shapes exceed the stack buffers' limits or the format is unknown (nothing
 * is written then). `values`: the fp8 format's 256 values (NULL for float32 and bfloat16 caches).
 * Work items are whole requests when there are enough of them to keep every thread busy (each
 * cache block is then streamed once, front to back), else (request, kv head) pairs. Consecutive
 * rows that read one context (a request verifying proposals or a prompt chunk, on the vector path)
 * are attended together, a (run of rows, kv head) pair per work item: their context is read once,
 * not once a row. With fewer runs than twice the threads, the vector path cuts their contexts into
 * partitions (attend_split). */
int kvserve_paged_decode(const float *query, const void *key_cache, const void *value_cache, int kv_format,
                         const float *values, const int32_t *tables, int64_t table_stride, const int32_t *lens,
                         float *out, int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                         int64_t block_size, int64_t window, float scale, int num_threads) {
    const int64_t group = num_heads / num_kv_heads;
    if (num_heads > KVSERVE_MAX_HEADS || head_dim > KVSERVE_MAX_HEAD_DIM || block_size > KVSERVE_MAX_BLOCK)
        return -1;
    if (kv_format < KVSERVE_KV_F32 || kv_format > KVSERVE_KV_FP8_E5M2 || (kv_format >= KVSERVE_KV_FP8_E4M3 && !values))
        return -1;
    const int64_t row_stride = num_kv_heads * head_dim; /* floats between consecutive slots */
    const int64_t q_stride = num_heads * head_dim;
#if defined(KVSERVE_VEC16)
    const int shape = vec16_shape(kv_format, head_dim, group);
    const attend_fn fast = shape >= 0 ? vec16_kernels[shape] : NULL;
    if (fast) {
        int64_t starts[batch + 1];
        const int64_t runs = context_runs(tables, table_stride, lens, window, batch, starts);
        /* Fewer runs than twice the threads (one request's three kv heads went 2:1 over two threads,
         * Gemma 3's one kv head left the second idle, and a (run, kv head) item reads a slice of every
         * cache row, which memory serves slower than whole rows: 2 or 3 requests at 1,000 tokens
         * 0.78-0.97x split, BENCHMARKS.md section 7): the runs' partitions in turn. */
        if (runs < 2 * (int64_t)num_threads &&
            !attend_split(shape, kv_format, query, key_cache, value_cache, tables, table_stride, lens, out, batch,
                          num_heads, num_kv_heads, head_dim, block_size, window, scale, num_threads, starts, runs))
            return 0;
        if (runs < batch) {
            const attend_rows_fn fast_rows = vec16_rows_kernels[shape];
            int64_t order[runs];
            costliest_first(starts, lens, window, runs, order);
            /* A thread takes a run's kv heads together: handed out one at a time, the two threads
             * read slices of one context side by side (4 requests x 4 verify rows 1.19x slower). */
#pragma omp parallel for schedule(dynamic, num_kv_heads) num_threads(num_threads)
            for (int64_t item = 0; item < runs * num_kv_heads; ++item) {
                const int64_t run = order[item / num_kv_heads];
                const int64_t kv = item % num_kv_heads;
                const int64_t b = starts[run], end = starts[run + 1];
                const int32_t *table = tables + b * table_stride;
                if (end - b > 1) {
                    fast_rows(query + b * q_stride, lens + b, end - b, q_stride, key_cache, value_cache, table,
                              out + b * q_stride, kv, row_stride, block_size, scale);
                } else {
                    const int64_t len = lens[b], begin = first_visible(len, window);
                    fast(query + b * q_stride, key_cache, value_cache, table, begin, len, out + b * q_stride, kv,
                         kv + 1, row_stride, block_size, scale);
                }
            }
            return 0;
        }
    }
#endif
    const int64_t split = batch >= 2 * (int64_t)num_threads ? 1 : num_kv_heads; /* items per request */
    const int64_t items = batch * split, heads_per_item = num_kv_heads / split;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t item = 0; item < items; ++item) {
        const int64_t b = item / split, lo = (item % split) * heads_per_item;
        const float *q = query + b * q_stride;
        float *o = out + b * q_stride;
        const int32_t *table = tables + b * table_stride;
        const int64_t hi = lo + heads_per_item;
        const int64_t len = lens[b], begin = first_visible(len, window);
#if defined(KVSERVE_VEC16)
        if (fast) {
            fast(q, key_cache, value_cache, table, begin, len, o, lo, hi, row_stride, block_size, scale);
            continue;
        }
#endif
        if (head_dim == 64)
            attend_64(q, key_cache, value_cache, kv_format, values, table, begin, len, o, lo, hi, group, row_stride,
                      block_size, scale);
        else if (head_dim == 128)
            attend_128(q, key_cache, value_cache, kv_format, values, table, begin, len, o, lo, hi, group, row_stride,
                       block_size, scale);
        else
            attend(q, key_cache, value_cache, kv_format, values, table, begin, len, o, lo, hi, group, head_dim,
                   row_stride, block_size, scale);
    }
    return 0;
}

/* float32 caches: the entry point as it was before the cache formats (for native callers). */
int kvserve_paged_decode_f32(const float *query, const float *key_cache, const float *value_cache,
                             const int32_t *tables, int64_t table_stride, const int32_t *lens, float *out,
                             int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                             int64_t block_size, int64_t window, float scale, int num_threads) {
    return kvserve_paged_decode(query, key_cache, value_cache, KVSERVE_KV_F32, NULL, tables, table_stride, lens, out,
                                batch, num_heads, num_kv_heads, head_dim, block_size, window, scale, num_threads);
}

/* n values of a cache in `kv_format` from element 0 on, widened to float32 into out: 16 at a time as
 * the vector path loads them, the rest (or all, without one) as the scalar path does. The
 * tests compare both with torch's conversion on every code. */
void kvserve_kv_to_f32(const void *src, int kv_format, const float *values, int64_t n, float *out) {
    int64_t i = 0;
#if defined(KVSERVE_VEC16)
    for (; i + 16 <= n; i += 16) {
        const v16 x = kv_format == KVSERVE_KV_F32    ? load16(KVSERVE_KV_F32, src, i)
                         : kv_format == KVSERVE_KV_BF16 ? load16(KVSERVE_KV_BF16, src, i)
                         : kv_format == KVSERVE_KV_FP8_E4M3
                             ? v16_mul(load16(KVSERVE_KV_FP8_E4M3, src, i), v16_set1(E4M3_UNIT))
                             : load16(KVSERVE_KV_FP8_E5M2, src, i);
        v16_store(out + i, x);
    }
#endif
    float buf[16];
    for (; i < n; i += 16) {
        const int64_t m = n - i < 16 ? n - i : 16;
        memcpy(out + i, row_f32(src, kv_format, values, i, m, buf), sizeof(float) * (size_t)m);
    }
}
