/* Writing float32 keys and values into a KV cache of any of its formats, as kernels/kv_quant.py's
 * `quantize` converts them: bfloat16 and the two fp8 formats round to nearest even, the fp8 ones
 * after clamping to their largest finite value (the scale is 1.0). The result is torch's
 * conversion bit for bit (tests/kernels/test_cpu_kv_write.py compares them on every float16
 * value and on random floats of every magnitude), so the native decode step writes the same cache
 * as the layer-by-layer path. Format codes are cpu_decode_attention.c's KVSERVE_KV_*. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline uint16_t to_bf16(float x) {
    const uint32_t u = float_bits(x);
    if (isnan(x)) return 0x7FC0; /* torch's quiet NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* An fp8 code of `mant` mantissa bits and exponent bias `bias` for |x| <= the format's largest
 * finite value: subnormals on their fixed step, normals by rounding the float's mantissa to `mant`
 * bits (a carry moves into the exponent, as it should). */
static inline uint8_t to_fp8(float x, int mant, int bias, float limit, uint8_t nan_code) {
    if (isnan(x)) return nan_code;
    const uint8_t sign = x < 0.0f || (x == 0.0f && signbit(x)) ? 0x80 : 0;
    float a = fabsf(x);
    if (a > limit) a = limit;
    const float min_normal = ldexpf(1.0f, 1 - bias);
    if (a < min_normal) { /* step 2^(1 - bias - mant): the codes 0 .. 2^mant (the last one the min normal) */
        const float q = nearbyintf(ldexpf(a, bias - 1 + mant));
        return sign | (uint8_t)q;
    }
    const int drop = 23 - mant;
    const uint32_t u = float_bits(a);
    const uint32_t r = (u + ((1u << (drop - 1)) - 1u) + ((u >> drop) & 1u)) >> drop; /* exponent and mant bits */
    const int exponent = (int)(r >> mant) - 127 + bias;
    return sign | (uint8_t)((exponent << mant) | (r & ((1u << mant) - 1u)));
}

/* n values of src into dst in `format`: 0 float32, 1 bfloat16, 2 fp8 e4m3fn, 3 fp8 e5m2. */
void kvserve_kv_from_f32(const float *src, int64_t n, int format, void *dst) {
    switch (format) {
    case 0:
        memcpy(dst, src, sizeof(float) * (size_t)n);
        break;
    case 1:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = to_bf16(src[i]);
        break;
    case 2:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = to_fp8(src[i], 3, 7, 448.0f, 0x7F);
        break;
    default:
        for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = to_fp8(src[i], 2, 15, 57344.0f, 0x7F);
        break;
    }
}
