/* Batched LoRA products for the CPU (float32): the shrink x -> t and the expand t -> y of
 * kernels/lora_sgmv.py in one call per projection target, rows grouped by adapter slot.
 *
 * Group g owns rows order[group_starts[g] .. group_starts[g+1]) and uses slot group_slots[g]:
 *
 *   t[i, r]        = sum_k x[order[i], k] * A[slot, r, k]            r < rank[slot]
 *   y[row, off + n] += scale[slot] * sum_r t[i, r] * Bt[slot, r, n]
 *
 * An adapter's A rows (K floats each) and Bt rows (N floats each) are read once for all rows of
 * its group, which is what makes the product cost in proportion to the distinct adapters of a
 * step and not to its requests. The shrink is split over (group, rank) pairs, the expand over
 * (group, block of 64 outputs); small products stay on the calling thread (the caller decides).
 * Built with the other cpu_*.c files by kvserve.kernels.cpu_native.
 */
#include <stdint.h>

#define KVSERVE_LORA_BLOCK_N 64

int kvserve_lora_f32(const float *x, int64_t x_stride, int64_t k, const float *a, const float *bt, int64_t r_max,
                     int64_t n, const float *scales, const int64_t *ranks, const int64_t *order,
                     const int64_t *group_starts, const int64_t *group_slots, int64_t groups, float *y,
                     int64_t y_stride, int64_t y_off, float *t, int num_threads) {
    if (k <= 0 || n <= 0 || r_max <= 0 || groups < 0) return 1;
    const int64_t n_blocks = (n + KVSERVE_LORA_BLOCK_N - 1) / KVSERVE_LORA_BLOCK_N;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static) collapse(2)
        for (int64_t g = 0; g < groups; ++g) {
            for (int64_t r = 0; r < r_max; ++r) {
                const int64_t slot = group_slots[g];
                if (r >= ranks[slot]) continue;
                const float *ar = a + (slot * r_max + r) * k;
                for (int64_t i = group_starts[g]; i < group_starts[g + 1]; ++i) {
                    const float *xr = x + order[i] * x_stride;
                    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                    for (int64_t j = 0; j < k; ++j) acc += xr[j] * ar[j];
                    t[i * r_max + r] = acc;
                }
            }
        }
        /* the implicit barrier: every t row is complete before any expand reads it */
#pragma omp for schedule(static) collapse(2)
        for (int64_t g = 0; g < groups; ++g) {
            for (int64_t nb = 0; nb < n_blocks; ++nb) {
                const int64_t slot = group_slots[g], rank = ranks[slot];
                const float scale = scales[slot];
                const int64_t n0 = nb * KVSERVE_LORA_BLOCK_N;
                const int64_t n1 = n0 + KVSERVE_LORA_BLOCK_N < n ? n0 + KVSERVE_LORA_BLOCK_N : n;
                for (int64_t i = group_starts[g]; i < group_starts[g + 1]; ++i) {
                    float acc[KVSERVE_LORA_BLOCK_N] = {0};
                    for (int64_t r = 0; r < rank; ++r) {
                        const float tr = t[i * r_max + r];
                        const float *br = bt + (slot * r_max + r) * n;
#pragma omp simd
                        for (int64_t c = n0; c < n1; ++c) acc[c - n0] += tr * br[c];
                    }
                    float *yr = y + order[i] * y_stride + y_off;
#pragma omp simd
                    for (int64_t c = n0; c < n1; ++c) yr[c] += scale * acc[c - n0];
                }
            }
        }
    }
    return 0;
}
