/* The elementwise steps of a Llama/Qwen2 decoder layer, one native call each, for the rows of a step.

   In torch each of these is five to ten small operations (RMSNorm: cast, square, mean, add, rsqrt, two products;
   rotary embedding: products, a rotated copy, a sum per tensor; SiLU times up), and on the few rows of a decode step
   their dispatch costs more than their arithmetic. Here each is one pass over the rows, parallel over rows.

   Every row is computed from its own values alone, in a fixed order: its bits do not depend on how many rows share
   the call. Each `_rows` function shares its rows out between the threads of an enclosing parallel region (the
   native decoder step runs a whole step in one); the public functions open a region of their own. Plain C with
   GCC/Clang vector extensions, built per host by kernels/native.py. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lanes.h"

/* sum[r] = x[r] + delta[r] (where delta is given; else the row is x[r]), then out[r] = row / sqrt(mean(row^2) + eps)
   * weight: HF's RMSNorm in fp32 after the residual sum. */
static void add_rms_norm_rows(int64_t rows, int64_t width, const float *x, const float *delta, const float *weight,
                              float eps, float *sum, float *out) {
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * width;
        if (delta) {
            for (int64_t c = 0; c < width; c++) sum[r * width + c] = row[c] + delta[r * width + c];
            row = sum + r * width;
        }
        float part[16] = {0};
        int64_t c = 0;
        for (; c + 16 <= width; c += 16)
            for (int l = 0; l < 16; l++) part[l] += row[c + l] * row[c + l];
        for (; c < width; c++) part[c % 16] += row[c] * row[c];
        for (int w = 8; w > 0; w /= 2)
            for (int l = 0; l < w; l++) part[l] += part[l + w];
        float scale = 1.0f / sqrtf(part[0] / (float)width + eps);
        for (c = 0; c < width; c++) out[r * width + c] = weight[c] * (row[c] * scale);
    }
}

void add_rms_norm(int64_t rows, int64_t width, const float *x, const float *delta, const float *weight, float eps,
                  float *sum, float *out, int64_t threads) {
#pragma omp parallel num_threads(threads) if (rows > 1)
    add_rms_norm_rows(rows, width, x, delta, weight, eps, sum, out);
}

/* The rotary embedding of HF's apply_rotary_pos_emb, in place: for each row r and head h of q (heads of d floats,
   rows ld apart), v[j] <- v[j] cos[r][j] + rotate_half(v)[j] sin[r][j], rotate_half(v) = (-v[d/2:], v[:d/2]). */
static void rotary_rows(int64_t rows, int64_t heads, int64_t d, float *q, int64_t ld, const float *cos,
                        const float *sin) {
    int64_t half = d / 2;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows * heads; t++) {
        int64_t r = t / heads, h = t % heads;
        float *v = q + r * ld + h * d;
        const float *c = cos + r * d, *s = sin + r * d;
        float a[512];
        memcpy(a, v, d * sizeof(float));
        for (int64_t j = 0; j < half; j++) v[j] = a[j] * c[j] + (-a[j + half]) * s[j];
        for (int64_t j = half; j < d; j++) v[j] = a[j] * c[j] + a[j - half] * s[j];
    }
}

void rotary(int64_t rows, int64_t heads, int64_t d, float *q, int64_t ld, const float *cos, const float *sin,
            int64_t threads) {
#pragma omp parallel num_threads(threads) if (rows * heads > 8)
    rotary_rows(rows, heads, d, q, ld, cos, sin);
}

static inline v16 silu16(v16 g) { /* g * sigmoid(g), sigmoid from exp(-|g|) <= 1: no overflow either way */
    v16 e = exp16(select16(g > 0, -g, g)), one = (v16){0} + 1.0f;
    return g * select16(g > 0, one, e) / (one + e);
}

/* out[r][j] = silu(gate_up[r][j]) * gate_up[r][width + j]; a row's last partial lane group goes through a padded copy,
   so every element is computed alike */
static void silu_mul_rows(int64_t rows, int64_t width, const float *gate_up, float *out) {
    enum { CHUNK = 16 * LANES }; /* rows are shared out in chunks, so that a single row's work is shared too */
    int64_t chunks = (width + CHUNK - 1) / CHUNK;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < rows * chunks; t++) {
        int64_t r = t / chunks, j = t % chunks * CHUNK, end = j + CHUNK < width ? j + CHUNK : width;
        const float *g = gate_up + r * 2 * width, *u = g + width;
        float *o = out + r * width;
        for (; j + LANES <= end; j += LANES) {
            v16 res = silu16(load16(g + j)) * load16(u + j);
            memcpy(o + j, &res, sizeof res);
        }
        if (j < end) {
            float gs[LANES] = {0}, us[LANES] = {0}, os[LANES];
            memcpy(gs, g + j, (end - j) * sizeof(float));
            memcpy(us, u + j, (end - j) * sizeof(float));
            v16 res = silu16(load16(gs)) * load16(us);
            memcpy(os, &res, sizeof os);
            memcpy(o + j, os, (end - j) * sizeof(float));
        }
    }
}

void silu_mul(int64_t rows, int64_t width, const float *gate_up, float *out, int64_t threads) {
#pragma omp parallel num_threads(threads) if (rows * width > 2048)
    silu_mul_rows(rows, width, gate_up, out);
}
