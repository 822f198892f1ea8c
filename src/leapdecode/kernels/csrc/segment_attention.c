/* Attention of a flat batch's rows over their own sequences' KV buffers, every sequence in one call.

   The flat batch holds the new rows of many sequences side by side. Sequence s owns a key and a value buffer per
   layer (fp32, [kv_heads, >= past_s + n_s, head_dim], rows contiguous); its n_s new rows sit at rows first_s ..
   first_s + n_s of the batch, at positions past_s .. past_s + n_s. The kernel first copies each sequence's new
   keys/values into its buffers at past_s (unless their owner did), then, in parallel over (sequence, query head),
   computes for each new row i causal attention over keys 0 .. past_s + i: scores q.k * scale, softmax in fp32 (max
   subtracted), the weighted sum of values.

   Each row is computed from its own keys alone, in an order that depends only on how many keys it sees: a row gets
   the same bits in a one-row step as in a step that verifies several drafted rows, whatever else shares the call.
   Plain C with GCC/Clang vector extensions (16-float lanes), built per host by kernels/segment_attention.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define META 7

#include "lanes.h"

/* One sequence's new rows for one query head, over keys and values [span, D] (rows D apart, D a multiple of 16 up
   to 256). Per row: scores over its keys, softmax, the weighted sum of values. Every sum runs over the row's own
   keys in a fixed order that depends only on how many it sees: its bits do not depend on the other rows. scores
   holds span rounded up to 16 floats. */
static inline __attribute__((always_inline)) void rows_of_head(const float *qh, int64_t q_row, const float *kb,
                                                               const float *vb, int64_t n, int64_t past, int64_t D,
                                                               float scale, float *scores, float *out,
                                                               int64_t out_row) {
    int64_t chunks = D / LANES;
    v16 q[16], acc[16];
    for (int64_t i = 0; i < n; i++) {
        const float *qi = qh + i * q_row;
        for (int64_t c = 0; c < chunks; c++) q[c] = load16(qi + LANES * c);
        int64_t length = past + i + 1, blocks = (length + LANES - 1) / LANES; /* row i sees keys 0 .. past + i */
        for (int64_t j = 0; j < length; j++) {
            const float *kj = kb + j * D;
            v16 dot = q[0] * load16(kj);
            for (int64_t c = 1; c < chunks; c++) dot += q[c] * load16(kj + LANES * c);
            scores[j] = sum16(dot) * scale;
        }
        for (int64_t j = length; j < blocks * LANES; j++) scores[j] = -INFINITY;
        v16 top = load16(scores), total = (v16){0};
        for (int64_t b = 1; b < blocks; b++) top = max16(top, load16(scores + LANES * b));
        float most = top[0];
        for (int l = 1; l < LANES; l++) most = top[l] > most ? top[l] : most;
        for (int64_t b = 0; b < blocks; b++) {
            v16 p = exp16(load16(scores + LANES * b) - most);
            v16 valid = select16(load16(scores + LANES * b) > -INFINITY, p, (v16){0});
            memcpy(scores + LANES * b, &valid, sizeof valid);
            total += valid;
        }
        for (int64_t c = 0; c < chunks; c++) acc[c] = (v16){0};
        for (int64_t j = 0; j < length; j++) {
            const float *vj = vb + j * D;
            for (int64_t c = 0; c < chunks; c++) acc[c] += scores[j] * load16(vj + LANES * c);
        }
        float inverse = 1.0f / sum16(total);
        for (int64_t c = 0; c < chunks; c++) {
            v16 o = acc[c] * inverse;
            memcpy(out + i * out_row + LANES * c, &o, sizeof o);
        }
    }
}

/* meta: per sequence META int64: key buffer address, value buffer address, distance between the buffers' heads
   (in floats; rows within a head are head_dim apart), first row, rows, past, and whether to copy the new
   keys/values into the buffers first (0 where their owner stored them already). q/k/v: the batch's queries
   [heads, rows] and new keys/values [kv_heads, rows] of head_dim floats each, at the given strides (in floats)
   between heads and between rows, the last dimension contiguous. out: [rows, heads, head_dim], contiguous. */
void segment_attention(int64_t sequences, const int64_t *meta, const float *q, int64_t q_head, int64_t q_row,
                       const float *k, int64_t k_head, int64_t k_row, const float *v, int64_t v_head, int64_t v_row,
                       float *out, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale) {
    for (int64_t s = 0; s < sequences; s++) {
        const int64_t *m = meta + META * s;
        float *kb = (float *)(intptr_t)m[0], *vb = (float *)(intptr_t)m[1];
        int64_t stride = m[2], first = m[3], n = m[4], past = m[5];
        if (!m[6]) continue;
        for (int64_t g = 0; g < kv_heads; g++)
            for (int64_t i = 0; i < n; i++) {
                memcpy(kb + g * stride + (past + i) * head_dim, k + g * k_head + (first + i) * k_row,
                       head_dim * sizeof(float));
                memcpy(vb + g * stride + (past + i) * head_dim, v + g * v_head + (first + i) * v_row,
                       head_dim * sizeof(float));
            }
    }
    int64_t group = heads / kv_heads, tasks = sequences * heads;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; t++) {
        /* one sequence's new rows for query head h */
        const int64_t *m = meta + META * (t / heads);
        int64_t h = t % heads, g = h / group, first = m[3], n = m[4], past = m[5], span = past + n;
        const float *kb = (const float *)(intptr_t)m[0] + g * m[2];
        const float *vb = (const float *)(intptr_t)m[1] + g * m[2];
        const float *qh = q + h * q_head + first * q_row;
        float *scores = malloc((span + LANES) * sizeof(float));
        float *o = out + (first * heads + h) * head_dim;
        if (head_dim == 64) /* the common head sizes as constants: their loops unroll, q and acc stay in registers */
            rows_of_head(qh, q_row, kb, vb, n, past, 64, scale, scores, o, heads * head_dim);
        else if (head_dim == 128)
            rows_of_head(qh, q_row, kb, vb, n, past, 128, scale, scores, o, heads * head_dim);
        else
            rows_of_head(qh, q_row, kb, vb, n, past, head_dim, scale, scores, o, heads * head_dim);
        free(scores);
    }
}
