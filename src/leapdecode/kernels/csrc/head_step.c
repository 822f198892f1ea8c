/* One step of a draft head (leapdecode.heads) for the rows of a draft, in one native call: the next feature and its
   scores over the head's vocabulary slice.

   A head step is a few small products of one row (or a few: the engine drafts its sequences together) through ~5M
   weights, then ~2.4M more for the output slice. In torch each of its dozen operations is a Python call, a dispatch
   and an allocation, and at one stream those cost about as much as the products. Here the step is the head's formula
   f_next = z + down(silu(gate(h)) * up(h)), h = RMSNorm(z), z = fuse([f, RMSNorm(embed(x))]), then the slice's
   scores, run by the kernels the decoder step uses (panel products from 8-bit codes, RMSNorm, SiLU times up) in one
   parallel region. Every row is computed from its own values alone, so a sequence drafts the same tokens whatever
   else shares the call.

   Built per host by kernels/native.py with the kernels it includes. */
#include <stdlib.h>

#include "decoder_ops.c"
#include "panel_linear.c"

/* entries of `weights`: the embedding table (fp32 [tokens, d]), the two RMSNorm weights (embedding, MLP), then the
   codes and the scales of the four products' 8-bit panels: fuse [d, 2d], gate and up [2 inter, d], down [d, inter],
   the output slice [vocab, d] */
enum { EMBED, EMBED_NORM, MLP_NORM, FUSE, GATE_UP = FUSE + 2, DOWN = GATE_UP + 2, SLICE = DOWN + 2 };

static void coded(int64_t rows, int64_t n, int64_t k, const float *x, const int64_t *w, int at, float *y) {
    coded_panel_rows(8, rows, n, k, x, k, (const uint8_t *)(intptr_t)w[at], (const uint16_t *)(intptr_t)w[at + 1], 0,
                     y, n);
}

/* feature: [rows, d] in; tokens: the token each row steps past; out: [rows, d] the next features; scores: [rows,
   vocab] their scores over the slice */
void head_step(int64_t rows, int64_t d, int64_t inter, int64_t vocab, float embed_eps, float mlp_eps,
               const float *feature, const int64_t *tokens, const int64_t *weights, float *out, float *scores,
               int64_t threads) {
    const float *embed = (const float *)(intptr_t)weights[EMBED];
    float *joined = malloc(rows * 2 * d * sizeof(float)), *looked = malloc(rows * d * sizeof(float));
    float *normed = malloc(rows * d * sizeof(float)), *z = malloc(rows * d * sizeof(float));
    float *gate_up = malloc(rows * 2 * inter * sizeof(float)), *act = malloc(rows * inter * sizeof(float));
    for (int64_t r = 0; r < rows; r++) memcpy(looked + r * d, embed + tokens[r] * d, d * sizeof(float));
#pragma omp parallel num_threads(threads)
    {
        add_rms_norm_rows(rows, d, looked, 0, (const float *)(intptr_t)weights[EMBED_NORM], embed_eps, 0, normed);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            memcpy(joined + r * 2 * d, feature + r * d, d * sizeof(float));
            memcpy(joined + r * 2 * d + d, normed + r * d, d * sizeof(float));
        }
        coded(rows, d, 2 * d, joined, weights, FUSE, z);
        add_rms_norm_rows(rows, d, z, 0, (const float *)(intptr_t)weights[MLP_NORM], mlp_eps, 0, normed);
        coded(rows, 2 * inter, d, normed, weights, GATE_UP, gate_up);
        silu_mul_rows(rows, inter, gate_up, act);
        coded(rows, d, inter, act, weights, DOWN, out);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < rows * d; i++) out[i] += z[i];
        coded(rows, vocab, d, out, weights, SLICE, scores);
    }
    free(joined), free(looked), free(normed), free(z), free(gate_up), free(act);
}
