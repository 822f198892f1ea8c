/* Attention of a flat batch's rows over their own sequences' KV buffers, every sequence in one call.

   The flat batch holds the new rows of many sequences side by side. Sequence s owns a key and a value buffer per
   layer (fp32, [kv_heads, >= past_s + n_s, head_dim], rows contiguous); its n_s new rows sit at rows first_s ..
   first_s + n_s of the batch, at positions past_s .. past_s + n_s. The kernel first copies each sequence's new
   keys/values into its buffers at past_s (unless their owner did), then, in parallel over (sequence, query head) or
   (sequence, key/value head: see segment_attention_rows), computes for each new row i causal attention over keys 0
   .. past_s + i: scores q.k * scale, softmax in fp32 (max subtracted), the weighted sum of values.

   Each row is computed from its own keys alone, in an order that depends only on how many keys it sees: a row gets
   the same bits in a one-row step as in a step that verifies several drafted rows, whatever else shares the call.
   Plain C with GCC/Clang vector extensions (16-float lanes), built per host by kernels/segment_attention.py. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define META 7

#include "lanes.h"

/* The loops below work in the widest vector the host's registers hold (NL floats): GCC lowers 16-float vectors
   through the stack where registers hold 8 (a scalar splat or an accumulator spilled each key). Every lane does the
   arithmetic it did in 16-float lanes, and a dot product's two 8-lane halves are summed by sum16's tree, so the bits
   are those of the 16-lane code on every host. */
#if defined(__AVX512F__)
#define NL 16
typedef v16 vn;
#else
#define NL 8
typedef float vn __attribute__((vector_size(32)));
#endif

static inline vn loadn(const float *p) {
    vn x;
    memcpy(&x, p, sizeof x);
    return x;
}

/* sum16 of the 16 lanes held as LANES / NL native vectors */
static inline float sum_lanes(const vn *d) {
#if NL == 16
    return sum16(d[0]);
#else
    typedef float v4 __attribute__((vector_size(16)));
    vn a = d[0] + d[1];
    v4 lo, hi;
    memcpy(&lo, &a, sizeof lo);
    memcpy(&hi, (const float *)&a + 4, sizeof hi);
    v4 b = lo + hi;
    return (b[0] + b[2]) + (b[1] + b[3]);
#endif
}

/* One sequence's new rows for one query head, over keys and values [span, D] (rows D apart, D a multiple of 16 up
   to 256). Per row: scores over its keys, softmax, the weighted sum of values. Every sum runs over the row's own
   keys in a fixed order that depends only on how many it sees: its bits do not depend on the other rows. scores
   holds span rounded up to 16 floats. */
static inline __attribute__((always_inline)) void rows_of_head(const float *qh, int64_t q_row, const float *kb,
                                                               const float *vb, int64_t n, int64_t past, int64_t D,
                                                               float scale, float *scores, float *out,
                                                               int64_t out_row) {
    const int64_t parts = LANES / NL, vectors = D / NL; /* native vectors per 16 lanes, per row of D */
    vn q[256 / NL], acc[256 / NL];
    for (int64_t i = 0; i < n; i++) {
        const float *qi = qh + i * q_row;
        for (int64_t c = 0; c < vectors; c++) q[c] = loadn(qi + NL * c);
        int64_t length = past + i + 1, blocks = (length + LANES - 1) / LANES; /* row i sees keys 0 .. past + i */
        for (int64_t j = 0; j < length; j++) {
            const float *kj = kb + j * D;
            vn dot[LANES / NL];
            for (int64_t h = 0; h < parts; h++) dot[h] = q[h] * loadn(kj + NL * h);
            for (int64_t c = parts; c < vectors; c++) dot[c % parts] += q[c] * loadn(kj + NL * c);
            scores[j] = sum_lanes(dot) * scale;
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
        for (int64_t c = 0; c < vectors; c++) acc[c] = (vn){0};
        for (int64_t j = 0; j < length; j++) {
            const float *vj = vb + j * D;
            float weight = scores[j];
            for (int64_t c = 0; c < vectors; c++) acc[c] += weight * loadn(vj + NL * c);
        }
        float inverse = 1.0f / sum16(total);
        for (int64_t c = 0; c < vectors; c++) {
            vn o = acc[c] * inverse;
            memcpy(out + i * out_row + NL * c, &o, sizeof o);
        }
    }
}

/* segment_attention's work, shared out between the threads of the enclosing parallel region */
static void segment_attention_rows(int64_t sequences, const int64_t *meta, const float *q, int64_t q_head,
                                   int64_t q_row, const float *k, int64_t k_head, int64_t k_row, const float *v,
                                   int64_t v_head, int64_t v_row, float *out, int64_t heads, int64_t kv_heads,
                                   int64_t head_dim, float scale) {
#pragma omp for schedule(static)
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
    /* a task: one sequence's rows for one query head, or, where there are enough such tasks to share out between the
       threads, for every query head of one key/value head (grouped-query attention), so that the keys and values
       are read from memory once and from cache by the group's other heads. A lone sequence's rows (a prompt, a
       verification) are also cut into up to CHUNKS runs, so that the threads finish together: rows are computed
       alone, so their bits do not depend on the cut. */
    enum { CHUNKS = 8 };
    int64_t group = heads / kv_heads, threads = 1;
#ifdef _OPENMP
    threads = omp_get_num_threads();
#endif
    int64_t per = group > 1 && sequences * kv_heads >= 4 * threads ? group : 1; /* query heads a task */
    int64_t each = heads / per;                                                /* head tasks a sequence */
    int64_t chunks = sequences == 1 ? (meta[4] < CHUNKS ? meta[4] : CHUNKS) : 1; /* runs of rows a head task */
    if (chunks < 1) chunks = 1;
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < sequences * each * chunks; t++) {
        const int64_t *m = meta + META * (t / (each * chunks));
        int64_t n = m[4], c = t % chunks, h0 = t / chunks % each * per;
        int64_t start = n * c / chunks, rows = n * (c + 1) / chunks - start; /* this task's run of rows */
        int64_t first = m[3] + start, past = m[5] + start;
        float *scores = malloc((past + rows + LANES) * sizeof(float));
        for (int64_t h = h0; h < h0 + per; h++) {
            int64_t g = h / group;
            const float *kb = (const float *)(intptr_t)m[0] + g * m[2];
            const float *vb = (const float *)(intptr_t)m[1] + g * m[2];
            const float *qh = q + h * q_head + first * q_row;
            float *o = out + (first * heads + h) * head_dim;
            /* the common head sizes as constants: their loops unroll, q and acc stay in registers */
            if (head_dim == 64)
                rows_of_head(qh, q_row, kb, vb, rows, past, 64, scale, scores, o, heads * head_dim);
            else if (head_dim == 128)
                rows_of_head(qh, q_row, kb, vb, rows, past, 128, scale, scores, o, heads * head_dim);
            else
                rows_of_head(qh, q_row, kb, vb, rows, past, head_dim, scale, scores, o, heads * head_dim);
        }
        free(scores);
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
#pragma omp parallel
    segment_attention_rows(sequences, meta, q, q_head, q_row, k, k_head, k_row, v, v_head, v_row, out, heads,
                           kv_heads, head_dim, scale);
}
