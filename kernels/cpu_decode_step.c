/* A Llama-family (or Gemma 3) decoder stack for one decode step in one call: every layer's norms,
 * projections, rotary embedding, KV write, paged attention and MLP, over the other files' kernels.
 *
 * From Python a layer is ~30 operations (each a ctypes call, a torch allocation or a view) and at
 * batch 1 on SmolLM2 those dispatches were ~3 ms of a ~7 ms step, more than the attention. Here
 * the same kernels run in the same order with the same thread counts, so the result is the
 * per-operation path's bit for bit (tests/backend/worker/test_native_decode.py); only the Python
 * between them is gone. backend/worker/native_decode.py decides when a step may take it (decode
 * rows only, every projection on a native kernel) and keeps the descriptors.
 *
 * With LoRA adapter rows (backend/lora/), each projection's targets add their rows' products after
 * the base product, as the wrapped projections of backend/lora/layers.py do: cpu_lora.c's kernel,
 * target by target in the same order (q, k, v into qkv's columns; gate, up into gate_up's), on the
 * same inputs and outputs, so those steps too are the per-operation path's bit for bit.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

/* The kernels this file drives (built into the same library). */
int kvserve_paged_decode(const float *query, const void *key_cache, const void *value_cache, int kv_format,
                         const float *values, const int32_t *tables, int64_t table_stride, const int32_t *lens,
                         float *out, int64_t batch, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                         int64_t block_size, int64_t window, float scale, int num_threads);
void kvserve_rms_norm_f32(const float *x, const float *residual, const float *weight, float *out,
                          float *residual_out, int64_t rows, int64_t n, int64_t x_stride, int64_t r_stride,
                          float eps, int num_threads);
void kvserve_silu_and_mul_f32(const float *x, float *out, int64_t rows, int64_t d, int64_t x_stride,
                              int num_threads);
void kvserve_gelu_tanh_and_mul_f32(const float *x, float *out, int64_t rows, int64_t d, int64_t x_stride,
                                   int num_threads);
void kvserve_rotary_f32(float *x, int64_t rows, int64_t heads, int64_t row_stride, int64_t head_stride,
                        const float *cos, const float *sin, int64_t half, int neox, int num_threads);
void kvserve_kv_from_f32(const float *src, int64_t n, int format, void *dst);
int kvserve_linear_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const float *packed, int64_t n,
                       const float *bias, float *out, int64_t out_stride, int num_threads);
int kvserve_linear_i8_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const int8_t *packed,
                          const float *scales, int64_t n, const float *bias, float *out, int64_t out_stride,
                          int num_threads);
int kvserve_linear_grouped_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const void *packed,
                               int format, const float *scales, const float *zeros, int64_t n, const float *bias,
                               float *out, int64_t out_stride, int num_threads);
int kvserve_lora_f32(const float *x, int64_t x_stride, int64_t k, const float *a, const float *bt, int64_t r_max,
                     int64_t n, const float *scales, const int64_t *ranks, const int64_t *order,
                     const int64_t *group_starts, const int64_t *group_slots, int64_t groups, float *y,
                     int64_t y_stride, int64_t y_off, float *t, int num_threads);
int kvserve_grid_linear_f32(const float *x, int64_t x_stride, int64_t m, int64_t k, const uint8_t *packed, int bits,
                            int64_t n, const float *bias, float *out, int64_t out_stride, int num_threads);

/* How a projection runs at this step's row count: the kernel the module's forward would pick. */
enum { LIN_F32 = 0, LIN_I8 = 1, LIN_GROUPED = 2, LIN_STRIPS = 3 };

typedef struct {
    int64_t kind;   /* LIN_* */
    int64_t format; /* LIN_GROUPED: cpu_linear.c's format; LIN_STRIPS: the grid kind (4, 8, 16) */
    const void *packed;
    const float *scales; /* LIN_I8: per output; LIN_GROUPED: tile-major per group */
    const float *zeros;  /* LIN_GROUPED (not W_G8) */
    const float *bias;   /* or NULL */
    int64_t out_features;
    int64_t in_features;
} kvserve_linear_desc;

typedef struct {
    kvserve_linear_desc qkv, o, gate_up, down;
    const float *input_norm;      /* before attention, with the residual add from the second layer on */
    const float *attn_output_norm; /* Gemma: o_proj's output normed before it joins the residual; or NULL */
    const float *pre_mlp_norm;    /* with the residual add (Llama's post_attention_layernorm) */
    const float *mlp_output_norm; /* Gemma: down_proj's output normed; or NULL */
    const float *q_norm, *k_norm; /* per head (Gemma); or NULL */
    const float *cos, *sin;       /* this layer's rotary angles for the step's rows, [rows][rotary_half] */
    int64_t gelu;                 /* the gated activation: 0 SiLU, 1 tanh GELU */
    void *key_cache, *value_cache; /* [blocks][block_size][kv_heads][head_dim] in kv_format */
    int64_t kv_format;              /* cpu_decode_attention.c's KVSERVE_KV_* */
    const float *kv_values;         /* an fp8 format's 256 values (NULL for float32 and bfloat16) */
    const int32_t *tables;          /* this layer's KV group: int32 rows, table_stride apart */
    int64_t table_stride;
    const int32_t *lens;
    const int64_t *slots; /* [rows]: the cache slot of each row's key and value (negative: not stored) */
    int64_t window;       /* 0: full attention */
} kvserve_decode_layer;

/* One LoRA target of this step (backend/lora/slots.py's stacks and TargetGroups): its rows grouped
 * by adapter slot, and every layer's stacks (layer l's are l * slots * r_max rows in). */
typedef struct {
    const float *a;  /* [layers][slots][r_max][in_features]; NULL: no row of this step runs the target */
    const float *bt; /* [layers][slots][r_max][out_features] */
    const int64_t *ranks; /* [slots]: 0 where the slot's adapter lacks the target */
    int64_t in_features, out_features;
    int64_t y_off; /* its first column in the projection's output (qkv, gate_up: fused) */
    const int64_t *order, *group_starts, *group_slots;
    int64_t rows, groups;
} kvserve_lora_target;

/* The targets in backend/lora/adapter.py's TARGETS order. */
enum { LORA_Q = 0, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_TARGETS };

typedef struct {
    kvserve_lora_target targets[LORA_TARGETS];
    const float *scales; /* [slots] */
    int64_t slots, r_max;
    int64_t parallel_min_macs; /* below it a product stays on one thread (cpu_native.lora's rule) */
} kvserve_lora_step;

typedef struct {
    int64_t rows, hidden, intermediate, num_heads, num_kv_heads, head_dim, block_size, rotary_half;
    float eps, scale;
    int64_t num_threads;
    int64_t parallel_min_elements; /* below it an elementwise op stays on one thread (cpu_native.py) */
    const kvserve_lora_step *lora; /* this step's adapter rows, or NULL (base-model rows only) */
    int64_t split_row; /* nonzero: rows [0, split_row) and the rest run as two halves, one a thread (below) */
} kvserve_decode_shape;

static int run_linear(const kvserve_linear_desc *w, const float *x, int64_t m, float *out, int threads) {
    switch (w->kind) {
    case LIN_F32:
        return kvserve_linear_f32(x, w->in_features, m, w->in_features, (const float *)w->packed, w->out_features,
                                  w->bias, out, w->out_features, threads);
    case LIN_I8:
        return kvserve_linear_i8_f32(x, w->in_features, m, w->in_features, (const int8_t *)w->packed, w->scales,
                                     w->out_features, w->bias, out, w->out_features, threads);
    case LIN_GROUPED:
        return kvserve_linear_grouped_f32(x, w->in_features, m, w->in_features, w->packed, (int)w->format, w->scales,
                                          w->zeros, w->out_features, w->bias, out, w->out_features, threads);
    case LIN_STRIPS:
        return kvserve_grid_linear_f32(x, w->in_features, m, w->in_features, (const uint8_t *)w->packed,
                                       (int)w->format, w->out_features, w->bias, out, w->out_features, threads);
    default:
        return 3;
    }
}

/* Adds the LoRA products of targets [first, last) of layer l to y, a projection's output (x its
 * input), as kernels/cpu_native.py's lora() calls the kernel (t: scratch of rows * r_max floats). */
static int add_lora(const kvserve_decode_shape *s, int64_t l, int first, int last, const float *x, int64_t x_stride,
                    float *y, int64_t y_stride, float *t) {
    const kvserve_lora_step *lora = s->lora;
    if (!lora) return 0;
    for (int i = first; i < last; i++) {
        const kvserve_lora_target *T = lora->targets + i;
        if (!T->a || T->rows == 0) continue;
        const int64_t stack = lora->slots * lora->r_max;
        const int threads = T->rows * lora->r_max * (T->in_features + T->out_features) >= lora->parallel_min_macs
                                ? (int)s->num_threads : 1;
        if (kvserve_lora_f32(x, x_stride, T->in_features, T->a + l * stack * T->in_features,
                             T->bt + l * stack * T->out_features, lora->r_max, T->out_features, lora->scales,
                             T->ranks, T->order, T->group_starts, T->group_slots, T->groups, y, y_stride, T->y_off,
                             t, threads))
            return 4;
    }
    return 0;
}

static int elementwise_threads(const kvserve_decode_shape *s, int64_t elements) {
    return elements >= s->parallel_min_elements ? (int)s->num_threads : 1;
}

/* The step's rows on s->num_threads threads, every kernel splitting its work among them. */
static int decode_rows(const kvserve_decode_shape *s, const kvserve_decode_layer *layers, int64_t num_layers,
                       const float *x_in, float *x_out, float *residual_out) {
    const int64_t m = s->rows, hidden = s->hidden, d = s->head_dim;
    const int64_t q_size = s->num_heads * d, kv_size = s->num_kv_heads * d, qkv_size = q_size + 2 * kv_size;
    const int threads = (int)s->num_threads;
    const int64_t lora_t = s->lora ? m * s->lora->r_max : 0; /* the LoRA shrink's scratch */
    float *work = malloc(sizeof(float) * (size_t)(m * (5 * hidden + qkv_size + q_size + q_size + kv_size
                                                       + 3 * s->intermediate) + lora_t));
    if (!work) return 2;
    float *x = work, *residual = x + m * hidden, *h = residual + m * hidden, *attn_out = h + m * hidden;
    float *branch = attn_out + m * hidden; /* a branch's output before its own norm (Gemma) */
    float *qkv = branch + m * hidden, *q = qkv + m * qkv_size, *attn = q + m * q_size, *k = attn + m * q_size;
    float *gate_up = k + m * kv_size, *act = gate_up + m * 2 * s->intermediate;
    float *lora_scratch = act + m * s->intermediate;
    memcpy(x, x_in, sizeof(float) * (size_t)(m * hidden));
    const int norm_threads = elementwise_threads(s, m * hidden);
    const int rotary_q_threads = elementwise_threads(s, m * s->num_heads * 2 * s->rotary_half);
    const int rotary_k_threads = elementwise_threads(s, m * s->num_kv_heads * 2 * s->rotary_half);
    const int act_threads = elementwise_threads(s, m * s->intermediate);
    const int q_norm_threads = elementwise_threads(s, m * q_size), k_norm_threads = elementwise_threads(s, m * kv_size);
    int status = 0;
    for (int64_t l = 0; l < num_layers && !status; l++) {
        const kvserve_decode_layer *L = layers + l;
        if (l == 0) {
            memcpy(residual, x, sizeof(float) * (size_t)(m * hidden));
            kvserve_rms_norm_f32(x, NULL, L->input_norm, h, NULL, m, hidden, hidden, 0, s->eps, norm_threads);
        } else {
            kvserve_rms_norm_f32(x, residual, L->input_norm, h, residual, m, hidden, hidden, hidden, s->eps,
                                 norm_threads);
        }
        if ((status = run_linear(&L->qkv, h, m, qkv, threads))) break;
        if ((status = add_lora(s, l, LORA_Q, LORA_O, h, hidden, qkv, qkv_size, lora_scratch))) break;
        /* q and k as the model makes them: contiguous copies (normed per head where the model norms
         * them; a row's result does not depend on the threads), turned in place. */
        for (int64_t r = 0; r < m; r++) {
            const float *qr = qkv + r * qkv_size, *kr = qr + q_size;
            if (L->q_norm) {
                kvserve_rms_norm_f32(qr, NULL, L->q_norm, q + r * q_size, NULL, s->num_heads, d, d, 0, s->eps,
                                     q_norm_threads);
                kvserve_rms_norm_f32(kr, NULL, L->k_norm, k + r * kv_size, NULL, s->num_kv_heads, d, d, 0, s->eps,
                                     k_norm_threads);
            } else {
                memcpy(q + r * q_size, qr, sizeof(float) * (size_t)q_size);
                memcpy(k + r * kv_size, kr, sizeof(float) * (size_t)kv_size);
            }
        }
        kvserve_rotary_f32(q, m, s->num_heads, q_size, d, L->cos, L->sin, s->rotary_half, 1, rotary_q_threads);
        kvserve_rotary_f32(k, m, s->num_kv_heads, kv_size, d, L->cos, L->sin, s->rotary_half, 1, rotary_k_threads);
        const int64_t slot_bytes = kv_size * (L->kv_format == 0 ? 4 : L->kv_format == 1 ? 2 : 1);
        for (int64_t r = 0; r < m; r++) {
            if (L->slots[r] < 0) continue;
            kvserve_kv_from_f32(k + r * kv_size, kv_size, (int)L->kv_format,
                                (char *)L->key_cache + L->slots[r] * slot_bytes);
            kvserve_kv_from_f32(qkv + r * qkv_size + q_size + kv_size, kv_size, (int)L->kv_format,
                                (char *)L->value_cache + L->slots[r] * slot_bytes);
        }
        if ((status = kvserve_paged_decode(q, L->key_cache, L->value_cache, (int)L->kv_format, L->kv_values,
                                           L->tables, L->table_stride,
                                           L->lens, attn, m, s->num_heads, s->num_kv_heads, d, s->block_size,
                                           L->window, s->scale, threads)))
            break;
        if ((status = run_linear(&L->o, attn, m, L->attn_output_norm ? branch : attn_out, threads))) break;
        if ((status = add_lora(s, l, LORA_O, LORA_GATE, attn, q_size, L->attn_output_norm ? branch : attn_out, hidden,
                               lora_scratch)))
            break;
        if (L->attn_output_norm)
            kvserve_rms_norm_f32(branch, NULL, L->attn_output_norm, attn_out, NULL, m, hidden, hidden, 0, s->eps,
                                 norm_threads);
        kvserve_rms_norm_f32(attn_out, residual, L->pre_mlp_norm, h, residual, m, hidden, hidden, hidden, s->eps,
                             norm_threads);
        if ((status = run_linear(&L->gate_up, h, m, gate_up, threads))) break;
        if ((status = add_lora(s, l, LORA_GATE, LORA_DOWN, h, hidden, gate_up, 2 * s->intermediate, lora_scratch)))
            break;
        (L->gelu ? kvserve_gelu_tanh_and_mul_f32 : kvserve_silu_and_mul_f32)(gate_up, act, m, s->intermediate,
                                                                              2 * s->intermediate, act_threads);
        if ((status = run_linear(&L->down, act, m, L->mlp_output_norm ? branch : x, threads))) break;
        if ((status = add_lora(s, l, LORA_DOWN, LORA_TARGETS, act, s->intermediate, L->mlp_output_norm ? branch : x,
                               hidden, lora_scratch)))
            break;
        if (L->mlp_output_norm)
            kvserve_rms_norm_f32(branch, NULL, L->mlp_output_norm, x, NULL, m, hidden, hidden, 0, s->eps, norm_threads);
    }
    if (!status) {
        memcpy(x_out, x, sizeof(float) * (size_t)(m * hidden));
        memcpy(residual_out, residual, sizeof(float) * (size_t)(m * hidden));
    }
    free(work);
    return status;
}

/* The rows [first, first + rows) of the step: its layers' row-indexed arrays from that row on. */
static void rows_from(const kvserve_decode_shape *s, const kvserve_decode_layer *layers, int64_t num_layers,
                      int64_t first, int64_t rows, kvserve_decode_shape *part, kvserve_decode_layer *part_layers) {
    *part = *s;
    part->rows = rows;
    part->num_threads = 1;
    for (int64_t l = 0; l < num_layers; l++) {
        part_layers[l] = layers[l];
        part_layers[l].cos = layers[l].cos + first * s->rotary_half;
        part_layers[l].sin = layers[l].sin + first * s->rotary_half;
        part_layers[l].tables = layers[l].tables + first * layers[l].table_stride;
        part_layers[l].lens = layers[l].lens + first;
        part_layers[l].slots = layers[l].slots + first;
    }
}

/* x [rows][hidden] (the embeddings) -> x and residual [rows][hidden] after the last layer, as the
 * model's loop leaves them (the final norm adds them). Returns 0, or nonzero when a kernel declined.
 * The caller then runs the step the per-operation way: the KV rows this step already wrote are the
 * values that path writes again, and x_out and residual_out are scratch (a half that ran wrote its rows).
 *
 * With s->split_row on two threads (and no LoRA), each thread runs one half of the rows through every
 * layer alone, with no barrier between them. Where one half waits on its K/V reads in attention, the
 * other's projections find the FMA units free; split operation by operation, both threads wait on
 * the same reads at the same time. The price is each half reading the weights on its own. Every
 * kernel's result for a row depends neither on the rows beside it nor on the thread count, so the
 * bits are decode_rows' (the tests compare both with the per-operation path). The caller decides per
 * step from what the step reads, and splits where a request starts: a verification's row attends
 * over the keys and values its request's earlier rows write in the same layer, so they must be on
 * its thread (backend/worker/native_decode.py; BENCHMARKS.md section 7, eighteenth point). */
int kvserve_decode_step_f32(const kvserve_decode_shape *s, const kvserve_decode_layer *layers, int64_t num_layers,
                            const float *x_in, float *x_out, float *residual_out) {
    const int64_t first = s->split_row;
    if (first <= 0 || first >= s->rows || s->num_threads != 2 || s->lora)
        return decode_rows(s, layers, num_layers, x_in, x_out, residual_out);
    const int64_t hidden = s->hidden;
    kvserve_decode_layer *part_layers = malloc(sizeof(kvserve_decode_layer) * (size_t)(2 * num_layers));
    if (!part_layers) return 2;
    kvserve_decode_shape parts[2];
    rows_from(s, layers, num_layers, 0, first, parts, part_layers);
    rows_from(s, layers, num_layers, first, s->rows - first, parts + 1, part_layers + num_layers);
    int status[2] = {0, 0};
#pragma omp parallel num_threads(2)
    {
        /* Thread i takes half i; a team of one (the runtime's nesting limit) takes both. */
        for (int i = omp_get_thread_num(); i < 2; i += omp_get_num_threads()) {
            const int64_t at = i * first * hidden;
            status[i] = decode_rows(parts + i, part_layers + i * num_layers, num_layers, x_in + at, x_out + at,
                                    residual_out + at);
        }
    }
    free(part_layers);
    return status[0] ? status[0] : status[1];
}
