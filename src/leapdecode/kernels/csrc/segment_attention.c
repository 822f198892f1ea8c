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
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif
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

/* a * b + c rounded once, wherever it stands: the compiler's choice to fuse a product and a sum may differ between
   two copies of the same line (the pairs' groups below, this file built alone and inside decoder_step.c), so the
   sums that must give a row the same bits everywhere say it themselves. Where the machine has no fused multiply-add
   the compiler cannot fuse either. */
#if NL == 16
static inline vn fmadd(vn a, vn b, vn c) { return (vn)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#elif defined(__FMA__)
static inline vn fmadd(vn a, vn b, vn c) { return (vn)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
#elif defined(__FP_FAST_FMAF)
static inline vn fmadd(vn a, vn b, vn c) {
    for (int l = 0; l < NL; l++) c[l] = __builtin_fmaf(a[l], b[l], c[l]);
    return c;
}
#else
static inline vn fmadd(vn a, vn b, vn c) { return a * b + c; }
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

/* A task's (row, query head) pairs all read one key/value head of one sequence. They go through the keys together,
   a block of keys at a time, in groups of pairs whose queries and running sums stay in registers (or, on AVX2, near
   them): a block is read from memory once, by the first group, and from the L1 cache by the others, and a group's
   independent sums keep the multiply-add units busy where one pair's few running sums would wait on each other. Per pair the arithmetic is what it is alone, in the same order: scores q.k * scale
   (16-lane products, sum_lanes), softmax in fp32 with the max subtracted, the weighted sum of values in key order;
   so a pair's bits depend only on how many keys it sees, never on the pairs beside it. */
#define GROUP_FLOATS 256 /* a group's queries (and as many running sums): half of AVX-512's registers; twice AVX2's,
                            whose spills to the L1 cache cost less than grouping the pairs saves */
#define GROUP (GROUP_FLOATS / 64) /* the most pairs in a group (at head size 64) */
#define SUPER 12          /* the most pairs that share a pass over the keys */
#define BLOCK 64          /* keys a block (16 kB of keys of 64 floats) */

typedef struct {
    const float *q; /* its query */
    float *out;     /* its output */
    int64_t length; /* keys it sees: 0 .. length - 1 */
} Pair;

/* scores[t * stride + j] of the g pairs for keys j0 .. j1 - 1 (those a pair sees); keys below `common` are seen by
   all */
static inline __attribute__((always_inline)) void group_scores(int g, const Pair *pairs, const float *kb, int64_t D,
                                                               float scale, float *scores, int64_t stride, int64_t j0,
                                                               int64_t j1, int64_t common) {
    const int64_t parts = LANES / NL, vectors = D / NL; /* native vectors per 16 lanes, per row of D */
    vn q[GROUP][256 / NL];
    for (int t = 0; t < g; t++)
        for (int64_t c = 0; c < vectors; c++) q[t][c] = loadn(pairs[t].q + NL * c);
    for (int64_t j = j0; j < j1; j++) {
        vn key[256 / NL];
        for (int64_t c = 0; c < vectors; c++) key[c] = loadn(kb + j * D + NL * c);
        for (int t = 0; t < g; t++) {
            if (j >= common && j >= pairs[t].length) continue;
            vn dot[LANES / NL];
            for (int64_t h = 0; h < parts; h++) /* the first two products of a lane: the first fused */
                dot[h] = vectors > parts ? fmadd(q[t][h], key[h], q[t][h + parts] * key[h + parts]) : q[t][h] * key[h];
            for (int64_t c = 2 * parts; c < vectors; c++) dot[c % parts] = fmadd(q[t][c], key[c], dot[c % parts]);
            scores[t * stride + j] = sum_lanes(dot) * scale;
        }
    }
}

/* the g pairs' running sums (sums: D floats a pair, carried from block to block) over values j0 .. j1 - 1, weighted
   by their softmax numerators in scores, in key order */
static inline __attribute__((always_inline)) void group_values(int g, const Pair *pairs, const float *vb, int64_t D,
                                                               const float *scores, int64_t stride, int64_t j0,
                                                               int64_t j1, int64_t common, float *sums) {
    const int64_t vectors = D / NL;
    vn acc[GROUP][256 / NL];
    for (int t = 0; t < g; t++)
        for (int64_t c = 0; c < vectors; c++) acc[t][c] = loadn(sums + t * D + NL * c);
    for (int64_t j = j0; j < j1; j++) {
        const float *vj = vb + j * D;
        for (int64_t c = 0; c < vectors; c++) {
            vn value = loadn(vj + NL * c);
            for (int t = 0; t < g; t++)
                if (j < common || j < pairs[t].length)
                    acc[t][c] = fmadd((vn){0} + scores[t * stride + j], value, acc[t][c]);
        }
    }
    for (int t = 0; t < g; t++)
        for (int64_t c = 0; c < vectors; c++) memcpy(sums + t * D + NL * c, &acc[t][c], sizeof(vn));
}

/* the head size as a constant where it is a common one (the loops unroll) and the group's size as a constant up to
   GROUP_FLOATS / D */
#define BY_GROUP(call, D_, most)                                                                                     \
    switch (g) {                                                                                                     \
    case 1: call(1, D_); break;                                                                                      \
    case 2: if ((most) >= 2) { call(2, D_); } break;                                                                 \
    case 3: if ((most) >= 3) { call(3, D_); } break;                                                                 \
    default: if ((most) >= 4) { call(4, D_); } break;                                                                \
    }
#define BY_SIZE(call)                                                                                                \
    if (D == 64) {                                                                                                   \
        BY_GROUP(call, 64, GROUP_FLOATS / 64)                                                                        \
    } else if (D == 128) {                                                                                           \
        BY_GROUP(call, 128, GROUP_FLOATS / 128)                                                                      \
    } else {                                                                                                         \
        BY_GROUP(call, D, 1)                                                                                         \
    }

static int group_size(int64_t D) { return D == 64 || D == 128 ? (int)(GROUP_FLOATS / D) : 1; }

/* up to SUPER pairs, block by block */
static void attend_pairs(int count, const Pair *pairs, const float *kb, const float *vb, int64_t D, float scale,
                         float *scores, int64_t stride, float *sums) {
    int most = group_size(D);
    int64_t longest = 0, common = pairs[0].length;
    for (int t = 0; t < count; t++) {
        longest = pairs[t].length > longest ? pairs[t].length : longest;
        common = pairs[t].length < common ? pairs[t].length : common;
    }
    for (int64_t j0 = 0; j0 < longest; j0 += BLOCK)
        for (int first = 0; first < count; first += most) {
            int g = count - first < most ? count - first : most;
            int64_t j1 = j0 + BLOCK < longest ? j0 + BLOCK : longest;
#define SCORES(g_, D_) group_scores(g_, pairs + first, kb, D_, scale, scores + first * stride, stride, j0, j1, common)
            BY_SIZE(SCORES)
#undef SCORES
        }
    float inverse[SUPER];
    for (int t = 0; t < count; t++) {
        float *st = scores + t * stride;
        int64_t length = pairs[t].length, blocks = (length + LANES - 1) / LANES;
        for (int64_t j = length; j < blocks * LANES; j++) st[j] = -INFINITY;
        v16 top = load16(st), total = (v16){0};
        for (int64_t b = 1; b < blocks; b++) top = max16(top, load16(st + LANES * b));
        float high = top[0];
        for (int l = 1; l < LANES; l++) high = top[l] > high ? top[l] : high;
        for (int64_t b = 0; b < blocks; b++) {
            v16 p = exp16(load16(st + LANES * b) - high);
            v16 valid = select16(load16(st + LANES * b) > -INFINITY, p, (v16){0});
            memcpy(st + LANES * b, &valid, sizeof valid);
            total += valid;
        }
        inverse[t] = 1.0f / sum16(total);
    }
    memset(sums, 0, count * D * sizeof(float));
    for (int64_t j0 = 0; j0 < longest; j0 += BLOCK)
        for (int first = 0; first < count; first += most) {
            int g = count - first < most ? count - first : most;
            int64_t j1 = j0 + BLOCK < longest ? j0 + BLOCK : longest;
#define VALUES(g_, D_) group_values(g_, pairs + first, vb, D_, scores + first * stride, stride, j0, j1, common, sums + first * D_)
            BY_SIZE(VALUES)
#undef VALUES
        }
    for (int t = 0; t < count; t++)
        for (int64_t c = 0; c < D; c += NL) {
            vn o = loadn(sums + t * D + c) * inverse[t];
            memcpy(pairs[t].out + c, &o, sizeof o);
        }
}

/* A task's rows (rows of the sequence from `first`, row i seeing keys 0 .. past + i) for query heads h0 .. h0 + per
   - 1 of one key/value head: its pairs row by row (a row's heads side by side), SUPER at a time */
static void attend_task(const float *q, int64_t q_head, int64_t q_row, const float *kb, const float *vb, int64_t rows,
                        int64_t past, int64_t h0, int64_t per, int64_t D, float scale, float *out, int64_t heads) {
    int64_t count = rows * per, stride = (past + rows + LANES) / LANES * LANES;
    float *scores = malloc((count < SUPER ? count : SUPER) * (stride + D) * sizeof(float));
    Pair pairs[SUPER];
    for (int64_t p = 0; p < count; p += SUPER) {
        int n = count - p < SUPER ? (int)(count - p) : SUPER;
        for (int t = 0; t < n; t++) {
            int64_t i = (p + t) / per, h = h0 + (p + t) % per;
            pairs[t] = (Pair){q + h * q_head + i * q_row, out + (i * heads + h) * D, past + i + 1};
        }
        attend_pairs(n, pairs, kb, vb, D, scale, scores, stride, scores + n * stride);
    }
    free(scores);
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
    /* a task: one sequence's rows for every query head of one key/value head (grouped-query attention: the keys and
       values are read once for all of them, see attend_task), or, where that leaves fewer than two tasks a thread
       (one row of a lone sequence), for one query head. A lone sequence's rows (a prompt, a verification) are also
       cut into up to CHUNKS runs, so that the threads finish together: rows are computed alone, so their bits do not
       depend on the cut. */
    enum { CHUNKS = 8 };
    int64_t group = heads / kv_heads, threads = 1;
#ifdef _OPENMP
    threads = omp_get_num_threads();
#endif
    int64_t chunks = sequences == 1 ? (meta[4] < CHUNKS ? meta[4] : CHUNKS) : 1; /* runs of rows a sequence */
    if (chunks < 1) chunks = 1;
    int64_t per = group > 1 && sequences * kv_heads * chunks >= 2 * threads ? group : 1; /* query heads a task */
    int64_t each = heads / per; /* head tasks a sequence */
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < sequences * each * chunks; t++) {
        const int64_t *m = meta + META * (t / (each * chunks));
        int64_t n = m[4], c = t % chunks, h0 = t / chunks % each * per;
        int64_t start = n * c / chunks, rows = n * (c + 1) / chunks - start; /* this task's run of rows */
        int64_t first = m[3] + start, past = m[5] + start;
        int64_t g = h0 / group; /* per > 1 only where per == group: a task's heads read one key/value head */
        attend_task(q + first * q_row, q_head, q_row, (const float *)(intptr_t)m[0] + g * m[2],
                    (const float *)(intptr_t)m[1] + g * m[2], rows, past, h0, per, head_dim, scale,
                    out + first * heads * head_dim, heads);
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
