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

/* addresses per layer in `weights`: input RMSNorm weight, q/k/v panels and bias, output panels and bias, post-attention
   RMSNorm weight, gate/up panels and bias, down panels and bias (a bias is 0 where the layer has none) */
enum { NORM_IN, QKV, QKV_BIAS, OUT, OUT_BIAS, NORM_POST, GATE_UP, GATE_UP_BIAS, DOWN, DOWN_BIAS, WEIGHTS };

/* x: the step's rows [rows, hidden] (the embeddings in, the last layer's output residual out), cos/sin: [rows,
   head_dim]; segments: per sequence its first row, rows and past (keys already held); buffers: per sequence, per layer,
   its key buffer, value buffer (fp32 [kv_heads, >= past + rows, head_dim], rows contiguous) and the distance between
   their heads in floats. */
void decoder_step(int64_t layers, int64_t rows, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                  int64_t inter, float eps, float scale, float *x, const float *cos, const float *sin,
                  const int64_t *weights, int64_t sequences, const int64_t *segments, const int64_t *buffers,
                  int64_t threads) {
    int64_t width = (heads + 2 * kv_heads) * head_dim, attended = heads * head_dim;
    float *normed = malloc(rows * hidden * sizeof(float)), *delta = malloc(rows * hidden * sizeof(float));
    float *qkv = malloc(rows * width * sizeof(float)), *attn = malloc(rows * attended * sizeof(float));
    float *gate_up = malloc(rows * 2 * inter * sizeof(float)), *act = malloc(rows * inter * sizeof(float));
    int64_t *meta = malloc(sequences * META * sizeof(int64_t));
    for (int64_t l = 0; l < layers; l++) {
        const int64_t *w = weights + l * WEIGHTS;
#define AT(i) ((const float *)(intptr_t)w[i])
        add_rms_norm(rows, hidden, x, l ? delta : 0, AT(NORM_IN), eps, x, normed, threads);
        panel_linear(rows, width, hidden, normed, hidden, AT(QKV), AT(QKV_BIAS), qkv, width, threads);
        rotary(rows, heads + kv_heads, head_dim, qkv, width, cos, sin, threads);
        for (int64_t s = 0; s < sequences; s++) {
            const int64_t *b = buffers + (s * layers + l) * 3;
            int64_t *m = meta + s * META;
            m[0] = b[0], m[1] = b[1], m[2] = b[2];
            m[3] = segments[3 * s], m[4] = segments[3 * s + 1], m[5] = segments[3 * s + 2], m[6] = 1;
        }
        segment_attention(sequences, meta, qkv, head_dim, width, qkv + heads * head_dim, head_dim, width,
                          qkv + (heads + kv_heads) * head_dim, head_dim, width, attn, heads, kv_heads, head_dim,
                          scale);
        panel_linear(rows, hidden, attended, attn, attended, AT(OUT), AT(OUT_BIAS), delta, hidden, threads);
        add_rms_norm(rows, hidden, x, delta, AT(NORM_POST), eps, x, normed, threads);
        panel_linear(rows, 2 * inter, hidden, normed, hidden, AT(GATE_UP), AT(GATE_UP_BIAS), gate_up, 2 * inter,
                     threads);
        silu_mul(rows, inter, gate_up, act, threads);
        panel_linear(rows, hidden, inter, act, inter, AT(DOWN), AT(DOWN_BIAS), delta, hidden, threads);
#undef AT
    }
    for (int64_t i = 0; i < rows * hidden; i++) x[i] += delta[i];
    free(normed), free(delta), free(qkv), free(attn), free(gate_up), free(act), free(meta);
}
