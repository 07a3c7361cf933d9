/* Paged decode attention for the CPU, reading K/V in place through the block table (float32).
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
 *   out    [B, Hq, D]
 *
 * Each K/V row is read once for all the query heads that share it.
 * Softmax is computed online, one cache block at a time (scores of a block,
 * the block's maximum, one rescale of the accumulators per block; exp by a
 * vectorizable polynomial, since libm's expf is scalar), so the
 * kernel needs no buffer that grows with the context: everything lives on the
 * stack, bounded by the KVSERVE_MAX_* limits the caller checks.
 * Built by kvserve.kernels.cpu_native with -fopenmp; OpenMP here is torch's
 * own runtime (the libgomp.so.1 already loaded in the process), so the
 * region runs on the same thread team as torch's ops.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_exp.h"

#define KVSERVE_MAX_HEADS 64
#define KVSERVE_MAX_HEAD_DIM 256
#define KVSERVE_MAX_BLOCK 64

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

/* One request's query heads of kv heads [kv_lo, kv_hi) against its context, block by block, each
 * block's rows read once for all those heads (consecutive slots are `row_stride` floats apart).
 * `head_dim` is a compile-time constant where attend() is inlined into a specialised caller. */
static inline void attend(const float *restrict q, const float *restrict key_cache,
                          const float *restrict value_cache, const int32_t *restrict table, int64_t len,
                          float *restrict o, int64_t kv_lo, int64_t kv_hi, int64_t group, const int64_t head_dim,
                          int64_t row_stride, int64_t block_size, float scale) {
    const int64_t heads = (kv_hi - kv_lo) * group; /* query heads of this item */
    float acc[KVSERVE_MAX_HEADS * KVSERVE_MAX_HEAD_DIM];
    float p[KVSERVE_MAX_HEADS * KVSERVE_MAX_BLOCK]; /* p[i * KVSERVE_MAX_BLOCK + t]: head i, slot t */
    float mx[KVSERVE_MAX_HEADS], sum[KVSERVE_MAX_HEADS];
    memset(acc, 0, sizeof(float) * (size_t)(heads * head_dim));
    for (int64_t i = 0; i < heads; ++i) {
        mx[i] = -INFINITY;
        sum[i] = 0.0f;
    }
    const float *qh = q + kv_lo * group * head_dim;
    for (int64_t start = 0; start < len; start += block_size) {
        const int64_t n = len - start < block_size ? len - start : block_size;
        const int64_t first = (int64_t)table[start / block_size] * block_size * row_stride + kv_lo * head_dim;
        const float *k = key_cache + first, *v = value_cache + first;
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < heads; ++i)
                p[i * KVSERVE_MAX_BLOCK + t] =
                    dot(qh + i * head_dim, k + t * row_stride + (i / group) * head_dim, head_dim) * scale;
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
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < heads; ++i)
                axpy(acc + i * head_dim, p[i * KVSERVE_MAX_BLOCK + t], v + t * row_stride + (i / group) * head_dim,
                     head_dim);
    }
    float *oh = o + kv_lo * group * head_dim;
    for (int64_t i = 0; i < heads; ++i) {
        const float inv = 1.0f / sum[i];
        for (int64_t d = 0; d < head_dim; ++d) oh[i * head_dim + d] = acc[i * head_dim + d] * inv;
    }
}

#define ATTEND_WITH_HEAD_DIM(D)                                                                                  \
    static void attend_##D(const float *q, const float *kc, const float *vc, const int32_t *table, int64_t len, \
                           float *o, int64_t lo, int64_t hi, int64_t group, int64_t row_stride,                \
                           int64_t block_size, float scale) {                                                    \
        attend(q, kc, vc, table, len, o, lo, hi, group, D, row_stride, block_size, scale);                      \
    }
ATTEND_WITH_HEAD_DIM(64)
ATTEND_WITH_HEAD_DIM(128)

/* Returns 0, or -1 when the shapes exceed the stack buffers' limits (nothing is written then).
 * Work items are whole requests when there are enough of them to keep every thread busy (each
 * cache block is then streamed once, front to back), else (request, kv head) pairs. */
int kvserve_paged_decode_f32(const float *query, const float *key_cache, const float *value_cache,
                             const int32_t *tables, int64_t table_stride, const int32_t *lens, float *out,
                             int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                             int64_t block_size, float scale, int num_threads) {
    const int64_t group = num_heads / num_kv_heads;
    if (num_heads > KVSERVE_MAX_HEADS || head_dim > KVSERVE_MAX_HEAD_DIM || block_size > KVSERVE_MAX_BLOCK)
        return -1;
    const int64_t row_stride = num_kv_heads * head_dim; /* floats between consecutive slots */
    const int64_t split = batch >= 2 * (int64_t)num_threads ? 1 : num_kv_heads; /* items per request */
    const int64_t items = batch * split, heads_per_item = num_kv_heads / split;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t item = 0; item < items; ++item) {
        const int64_t b = item / split, lo = (item % split) * heads_per_item;
        const float *q = query + b * num_heads * head_dim;
        float *o = out + b * num_heads * head_dim;
        const int32_t *table = tables + b * table_stride;
        const int64_t hi = lo + heads_per_item;
        if (head_dim == 64)
            attend_64(q, key_cache, value_cache, table, lens[b], o, lo, hi, group, row_stride, block_size, scale);
        else if (head_dim == 128)
            attend_128(q, key_cache, value_cache, table, lens[b], o, lo, hi, group, row_stride, block_size, scale);
        else
            attend(q, key_cache, value_cache, table, lens[b], o, lo, hi, group, head_dim, row_stride, block_size,
                   scale);
    }
    return 0;
}
