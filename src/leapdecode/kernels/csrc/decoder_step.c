/* A whole decode or verification step through every decoder layer of a Llama/Qwen2 model, in one native call.

   On a small model a decode step's arithmetic is a few milliseconds of weight reading, and the per-layer plumbing
   between the kernels (a ctypes call, tensor allocations and Python bookkeeping for each of about ten operations per
   layer) costs a fifth as much again. This runs the same kernels, in the same order, on the same rows, from one call:
   per layer the residual sum with RMSNorm, the fused q/k/v product, rotary embedding, attention of every sequence over
   its own KV buffers (new keys and values written first), the output product, the residual sum with RMSNorm, the
   fused gate/up product, SiLU(gate) * up and the down product. Each operation is the very function the layer-by-layer
   forward calls (included below), so every value gets the same bits either way.

   Built per host by kernels/native.py with the three kernels it includes. */
#include <stdlib.h>

#include "decoder_ops.c"
#include "panel_linear.c"
#include "segment_attention.c"

/* entries per layer in `weights`: input RMSNorm weight; for the q/k/v product its panels, the bits of their codes (0:
   fp32 panels), their scales and the bias; the same for the output product; post-attention RMSNorm weight; the same
   for gate/up and for down (a bias or scales address is 0 where there is none) */
enum { NORM_IN, QKV, OUT = QKV + 4, NORM_POST = OUT + 4, GATE_UP, DOWN = GATE_UP + 4, WEIGHTS = DOWN + 4 };

/* y = x W^T (+ bias) for the product whose entries start at w[at], shared out between the region's threads */
static void product(int64_t rows, int64_t n, int64_t k, const float *x, const int64_t *w, int at, float *y) {
    const float *bias = (const float *)(intptr_t)w[at + 3];
    if (w[at + 1])
        coded_panel_rows(w[at + 1], rows, n, k, x, k, (const uint8_t *)(intptr_t)w[at],
                         (const uint16_t *)(intptr_t)w[at + 2], bias, y, n);
    else
        panel_rows(rows, n, k, x, k, (const float *)(intptr_t)w[at], bias, y, n);
}

/* x: the step's rows [rows, hidden] (the embeddings in, the last layer's output residual out), cos/sin: [rows,
   head_dim]; segments: per sequence its first row, rows and past (keys already held); buffers: per sequence, per layer,
   its key buffer, value buffer (fp32 [kv_heads, >= past + rows, head_dim], rows contiguous) and the distance between
   their heads in floats. The whole step runs in one parallel region: every thread goes through the layers, and each
   operation shares its work out between them (its end a barrier), so the threads are started once per step rather
   than once per operation. */
void decoder_step(int64_t layers, int64_t rows, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  int64_t inter, float eps, float scale, float *x, const float *cos, const float *sin,
                  const int64_t *weights, int64_t sequences, const int64_t *segments, const int64_t *buffers,
                  int64_t threads) {
    int64_t width = (heads + 2 * kv_heads) * head_dim, attended = heads * head_dim;
    float *normed = malloc(rows * hidden * sizeof(float)), *delta = malloc(rows * hidden * sizeof(float));
    float *qkv = malloc(rows * width * sizeof(float)), *attn = malloc(rows * attended * sizeof(float));
    float *gate_up = malloc(rows * 2 * inter * sizeof(float)), *act = malloc(rows * inter * sizeof(float));
    int64_t *meta = malloc(layers * sequences * META * sizeof(int64_t));
    for (int64_t l = 0; l < layers; l++)
        for (int64_t s = 0; s < sequences; s++) {
            const int64_t *b = buffers + (s * layers + l) * 3;
            int64_t *m = meta + (l * sequences + s) * META;
            m[0] = b[0], m[1] = b[1], m[2] = b[2];
            m[3] = segments[3 * s], m[4] = segments[3 * s + 1], m[5] = segments[3 * s + 2], m[6] = 1;
        }
#pragma omp parallel num_threads(threads)
    {
        for (int64_t l = 0; l < layers; l++) {
            const int64_t *w = weights + l * WEIGHTS;
#define AT(i) ((const float *)(intptr_t)w[i])
            add_rms_norm_rows(rows, hidden, x, l ? delta : 0, AT(NORM_IN), eps, x, normed);
            product(rows, width, hidden, normed, w, QKV, qkv);
            rotary_rows(rows, heads + kv_heads, head_dim, qkv, width, cos, sin);
            segment_attention_rows(sequences, meta + l * sequences * META, qkv, head_dim, width,
                                   qkv + heads * head_dim, head_dim, width, qkv + (heads + kv_heads) * head_dim,
                                   head_dim, width, attn, heads, kv_heads, head_dim, scale);
            product(rows, hidden, attended, attn, w, OUT, delta);
            add_rms_norm_rows(rows, hidden, x, delta, AT(NORM_POST), eps, x, normed);
            product(rows, 2 * inter, hidden, normed, w, GATE_UP, gate_up);
            silu_mul_rows(rows, inter, gate_up, act);
            product(rows, hidden, inter, act, w, DOWN, delta);
#undef AT
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows * hidden; i++) x[i] += delta[i];
    }
    free(normed), free(delta), free(qkv), free(attn), free(gate_up), free(act), free(meta);
}
