/* The decoder's small per-token operations for the CPU, each one pass over its rows (float32).
 *
 * In torch, RMSNorm with its residual add is seven operations (add, pow, mean,
 * add, rsqrt, two products) and SiLU-and-mul three, each its own pass over
 * memory and, with more than one thread, its own OpenMP region that ends at a
 * barrier. At decode sizes (a few rows of 576 or 1536) the work is a few
 * microseconds and the passes and barriers are most of the cost. Here each is
 * one pass, and small inputs stay on the calling thread (the caller picks
 * num_threads). Built with cpu_decode_attention.c by kvserve.kernels.cpu_native.
 */
#include <math.h>
#include <stdint.h>

#include "cpu_exp.h"
#include "cpu_vec16.h"

/* out = weight * norm(x [+ residual]); with a residual, residual_out = x + residual (it may be
 * `residual` itself: each row is read before it is written). Rows are `stride` floats apart. */
void kvserve_rms_norm_f32(const float *x, const float *residual, const float *weight, float *out,
                          float *residual_out, int64_t rows, int64_t n, int64_t x_stride, int64_t r_stride,
                          float eps, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t row = 0; row < rows; ++row) {
        const float *xr = x + row * x_stride;
        float *o = out + row * n;
        float ss = 0.0f;
        if (residual != 0) {
            const float *rr = residual + row * r_stride;
            float *ro = residual_out + row * n;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < n; ++i) {
                const float h = xr[i] + rr[i];
                ro[i] = h;
                ss += h * h;
            }
            xr = ro;
        } else {
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
        }
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) o[i] = weight[i] * (xr[i] * inv);
    }
}

/* out [rows, d] = act(x[:, :d]) * x[:, d:2d], x rows `x_stride` floats apart, for the two gated
 * activations, which share one form: silu(g) = g / (1 + exp(-g)), and gelu_tanh(g) =
 * g (1 + tanh(u)) / 2 with u = sqrt(2 / pi) (g + 0.044715 g^3), which is g / (1 + exp(-2u)).
 * GELU is a compile-time constant where this is inlined, so neither form branches per value. */
#if defined(KVSERVE_VEC16)
/* The scalar loop's act(g) * up on 16 lanes (v16_exp's FMAs round a little differently). */
static inline __attribute__((always_inline)) v16 gated16(const int GELU, v16 g, v16 up) {
    const v16 a = GELU ? v16_mul(v16_set1(2.0f * 0.7978845608028654f),
                                 v16_fma(v16_mul(v16_mul(v16_set1(0.044715f), g), g), g, g))
                       : g;
    return v16_mul(v16_div(g, v16_add(v16_set1(1.0f), v16_exp(v16_sub(v16_zero(), a)))), up);
}
#endif

static inline __attribute__((always_inline)) void gated_and_mul(const int GELU, const float *x, float *out,
                                                                int64_t rows, int64_t d, int64_t x_stride,
                                                                int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t row = 0; row < rows; ++row) {
        const float *gate = x + row * x_stride, *up = gate + d;
        float *o = out + row * d;
#if defined(KVSERVE_VEC16)
        /* GCC leaves the scalar loop below unvectorized under AVX2 ("control flow in loop", from
         * kvserve_exp's rintf and clamps), and at 8 lanes under AVX-512: on a Zen 3 it was 4.7 % of
         * a C=16 run's samples, most of them prefill's rows. */
        int64_t i = 0;
        for (; i + 16 <= d; i += 16) v16_store(o + i, gated16(GELU, v16_load(gate + i), v16_load(up + i)));
        if (i < d) {
            const int n = (int)(d - i);
            v16_store_first(o + i, n, gated16(GELU, v16_load_first(gate + i, n), v16_load_first(up + i, n)));
        }
#else
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) {
            const float g = gate[i];
            const float a = GELU ? 2.0f * 0.7978845608028654f * (g + 0.044715f * g * g * g) : g;
            o[i] = g / (1.0f + kvserve_exp(-a)) * up[i];
        }
#endif
    }
}

void kvserve_silu_and_mul_f32(const float *x, float *out, int64_t rows, int64_t d, int64_t x_stride,
                              int num_threads) {
    gated_and_mul(0, x, out, rows, d, x_stride, num_threads);
}

/* Gemma's GeGLU. */
void kvserve_gelu_tanh_and_mul_f32(const float *x, float *out, int64_t rows, int64_t d, int64_t x_stride,
                                   int num_threads) {
    gated_and_mul(1, x, out, rows, d, x_stride, num_threads);
}

/* Rotary embedding in place on x [rows][heads][...]: the first 2 * half values of each head turn by
 * the row's angles, cos [rows][half] and sin [rows][half]. Neox style pairs (i, i + half);
 * interleaved (GPT-J) style pairs (2i, 2i + 1). In torch this is ~15 operations per layer. */
void kvserve_rotary_f32(float *x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
                        const float *cos, const float *sin, int64_t half, int neox, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < rows; t++) {
        const float *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + t * row_stride + h * head_stride;
            if (neox) {
#pragma omp simd
                for (int64_t i = 0; i < half; i++) {
                    const float a = v[i], b = v[i + half];
                    v[i] = a * c[i] - b * s[i];
                    v[i + half] = b * c[i] + a * s[i];
                }
            } else {
                for (int64_t i = 0; i < half; i++) {
                    const float a = v[2 * i], b = v[2 * i + 1];
                    v[2 * i] = a * c[i] - b * s[i];
                    v[2 * i + 1] = b * c[i] + a * s[i];
                }
            }
        }
    }
}
