/* exp(x) for the native CPU kernels, vectorizable (libm's expf is scalar): 2^(x log2 e) split into
 * 2^n (the float's exponent bits) and 2^f, f in [-1/2, 1/2], by a degree-6 polynomial (relative
 * error ~2e-7, about libm's). x is clamped to [-87, 88], where float32 exp neither underflows nor
 * overflows: arguments below -87 give ~1e-38 instead of 0. */
#ifndef KVSERVE_CPU_EXP_H
#define KVSERVE_CPU_EXP_H

#include <math.h>
#include <stdint.h>

static inline float kvserve_exp(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float t = x * 1.44269504088896341f;
    const float n = rintf(t);
    const float f = t - n;
    float y = 1.5353362e-4f;
    y = y * f + 1.3398874e-3f;
    y = y * f + 9.6182669e-3f;
    y = y * f + 5.5503406e-2f;
    y = y * f + 2.4022652e-1f;
    y = y * f + 6.9314718e-1f;
    y = y * f + 1.0f;
    union { float f; int32_t i; } scale;
    scale.i = ((int32_t)n + 127) << 23;
    return y * scale.f;
}

#endif
