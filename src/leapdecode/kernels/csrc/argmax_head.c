/* The exact step of the argmax-only output head (kernels/argmax_head.py): from a row's bf16 logits, every token whose
   exact fp32 logit could still be the row's largest gets that exact logit, the others keep their bf16 value.

   Per row: the bf16 logits are widened to fp32 and their maximum taken; the proven error bound of the bf16 product
   (see ArgmaxOutputHead) gives the floor under which no token can beat it; each token at or above the floor gets
   its exact logit x . w_token. In torch this was a gather of every candidate's weight row and a product of
   them, which on a model's real features (hundreds to thousands of candidates a step: the bound is proven, hence
   loose) cost as much as the bf16 product itself. Here the candidates' dot products read their weight rows in
   place, sixteen candidates at a time, one lane each.

   Each exact logit is one accumulator summed over k = 0 .. D-1 in order with a fused multiply-add, starting from
   zero: the bits panel_linear.c gives that logit. So the head's argmax is that of the native fp32 head, near-ties
   included. Plain C with GCC/Clang vector extensions, built per host by kernels/native.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lanes.h"

static inline float widen(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &wide, sizeof f);
    return f;
}

/* out[t] = x . w[tokens[t]] for up to 16 tokens, each lane one token */
static void exact16(const float *x, const float *w, int64_t D, const int64_t *tokens, int count, float *out) {
    v16 acc = (v16){0};
    const float *rows[LANES];
    for (int l = 0; l < LANES; l++) rows[l] = w + tokens[l < count ? l : 0] * D;
    for (int64_t k = 0; k < D; k++) {
        v16 wk;
        for (int l = 0; l < LANES; l++) wk[l] = rows[l][k];
        acc += wk * x[k];
    }
    for (int l = 0; l < count; l++) out[l] = acc[l];
}

/* low: bf16 logits [R, V] (raw bits); x: the rows' fp32 features [R, D], ldx apart; w: the fp32 head [V, D];
   slack, rounding: the bound's constants; out: fp32 logits [R, V]. */
void argmax_head(int64_t R, int64_t V, int64_t D, const uint16_t *low, const float *x, int64_t ldx, const float *w,
                 float slack, float rounding, float *out, int64_t threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < R; r++) {
        const uint16_t *l = low + r * V;
        const float *xr = x + r * ldx;
        float *o = out + r * V, top = -INFINITY, norm = 0.0f, exact[LANES];
        for (int64_t v = 0; v < V; v++) {
            o[v] = widen(l[v]);
            top = o[v] > top ? o[v] : top;
        }
        for (int64_t k = 0; k < D; k++) norm += xr[k] * xr[k];
        float reach = top - 2.0f * slack * sqrtf(norm) - rounding * fabsf(top);
        float floor = reach >= 0 ? reach / (1.0f + rounding) : reach / (1.0f - rounding); /* l + rounding|l| = reach */
        int64_t batch[LANES];
        int n = 0;
        for (int64_t v = 0; v <= V; v++) { /* candidates in batches of 16 (only tokens already passed are written) */
            if (v < V && o[v] >= floor) batch[n++] = v;
            if (n == LANES || (v == V && n > 0)) {
                exact16(xr, w, D, batch, n, exact);
                for (int i = 0; i < n; i++) o[batch[i]] = exact[i];
                n = 0;
            }
        }
    }
}
