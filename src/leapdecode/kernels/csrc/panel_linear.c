/* y[M, N] = x[M, K] W^T (+ bias) for the few rows of a decode or verification step, W packed once into panels.

   A panel holds PANEL consecutive output columns of W as [K][PANEL] (the last panel zero-padded): the kernel streams
   each panel from memory once, in order, and multiplies it by up to ROWS input rows held in registers, so one row is
   a GEMV at memory speed and a few rows reuse every weight they read. Panels are split between torch's OpenMP threads.

   Every output element is one accumulator summed over k = 0 .. K-1 in order, with a fused multiply-add, then the bias
   added: its bits depend on its input row and its column alone, never on how many rows share the call or how they are
   tiled. So a verified draft row gets exactly the bits of a one-row step.
   Plain C with GCC/Clang vector extensions, built per host by kernels/native.py. */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VL 16
#define ROWS 12 /* 2 x 12 accumulators of 32 registers */
#elif defined(__AVX2__)
#define VL 8
#define ROWS 4 /* 2 x 4 accumulators of 16 registers */
#else
#define VL 4
#define ROWS 4
#endif
#define PANEL (2 * VL)

typedef float vf __attribute__((vector_size(VL * 4)));

static inline vf loadv(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

int64_t panel_width(void) { return PANEL; }

/* R rows (a constant after inlining, so the accumulators stay in registers) times one panel */
static inline __attribute__((always_inline)) void tile(const int R, int64_t K, const float *x, int64_t ldx,
                                                       const float *w, const float *bias, float *y, int64_t ldy,
                                                       int64_t cols) {
    vf lo[ROWS], hi[ROWS];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = (vf){0};
    for (int64_t k = 0; k < K; k++) {
        vf w0 = loadv(w + k * PANEL), w1 = loadv(w + k * PANEL + VL);
        for (int r = 0; r < R; r++) {
            float xr = x[r * ldx + k];
            lo[r] += w0 * xr;
            hi[r] += w1 * xr;
        }
    }
    float sums[PANEL];
    for (int r = 0; r < R; r++) {
        memcpy(sums, &lo[r], sizeof lo[r]);
        memcpy(sums + VL, &hi[r], sizeof hi[r]);
        float *out = y + r * ldy;
        if (bias)
            for (int64_t c = 0; c < cols; c++) out[c] = sums[c] + bias[c];
        else
            memcpy(out, sums, cols * sizeof(float));
    }
}

static void rows_times_panel(int R, int64_t K, const float *x, int64_t ldx, const float *w, const float *bias,
                             float *y, int64_t ldy, int64_t cols) {
    switch (R) {
#define CASE(n) \
    case n: tile(n, K, x, ldx, w, bias, y, ldy, cols); break;
        CASE(1) CASE(2) CASE(3) CASE(4)
#if ROWS > 4
        CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#endif
#undef CASE
    }
}

/* x: M rows of K floats, ldx apart; panels: as packed by kernels/native_linear.py; bias: N floats or NULL; y: M rows
   of N floats, ldy apart; threads: how many OpenMP threads to use (torch's setting, passed in: a thread's OpenMP
   default need not be torch's). */
void panel_linear(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const float *panels,
                  const float *bias, float *y, int64_t ldy, int64_t threads) {
    int64_t count = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < count; p++) {
        int64_t first = p * PANEL, cols = N - first < PANEL ? N - first : PANEL;
        for (int64_t m = 0; m < M; m += ROWS) {
            int R = M - m < ROWS ? (int)(M - m) : ROWS;
            rows_times_panel(R, K, x + m * ldx, ldx, panels + p * K * PANEL, bias ? bias + first : 0,
                             y + m * ldy + first, ldy, cols);
        }
    }
}
