/* y[M, N] = x[M, K] W^T (+ bias) for the few rows of a decode or verification step, W packed once into panels.

   A panel holds PANEL consecutive output columns of W as [K][PANEL] (the last panel zero-padded): the kernel streams
   each panel from memory once, in order, and multiplies it by up to ROWS input rows held in registers, so one row is
   a GEMV at memory speed and a few rows reuse every weight they read. Panels are split between torch's OpenMP threads.

   Every output element is one accumulator summed over k = 0 .. K-1 in order, with a fused multiply-add, then the bias
   added: its bits depend on its input row and its column alone, never on how many rows share the call or how they are
   tiled. So a verified draft row gets exactly the bits of a one-row step.

   coded_panel_linear computes the same products from a weight stored as codes: each group of 32 inputs of an output
   column holds w = d q + m with 4-bit codes q in 0..15 (the form of a GGUF Q4_1 weight dequantized to fp32) or
   w = d q with 8-bit codes q in -128..127 (Q8_0's, and Q5_0's and Q4_0's, whose codes fit), d and m fp16 values
   (stored as such: fp32 scales would be a third of a 4-bit weight's bytes), so that d q is exact in fp32; or (Q4K,
   GGUF Q4_K's form) 4-bit codes with fp32 d and m of at most 17 significant bits, d q exact in fp32; or (Q6M, for a
   fused weight of Q4_K and Q6_K parts) 8-bit codes with fp32 d and m per 16 inputs; or ("6-bit",
   GGUF Q6_K's form) w = d q with 8-bit codes per group of 16 inputs and d an fp32 value (Q6_K's d is an fp16 value
   times an 8-bit sub-scale: no fp16 value), d q exact in fp32. It rebuilds every w in registers, bit for bit (d q + m
   rounds once, fused or not), and sums in the same order: its outputs are panel_linear's on the fp32 weight, from
   under a sixth (4-bit) or just over a quarter (8-bit) of the bytes (kernels/native_linear.py encodes a weight only
   where every value comes back exactly).
   Plain C with GCC/Clang vector extensions, built per host by kernels/native.py. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define VL 16
#define ROWS 12 /* 2 x 12 accumulators of 32 registers */
#elif defined(__AVX2__)
#define VL 8
#define ROWS 6 /* 2 x 6 accumulators of 16 registers */
#else
#define VL 4
#define ROWS 4
#endif
#define PANEL (2 * VL)

/* the row counts a tile takes (1 .. ROWS), for the switches that give each its own inlined tile */
#if ROWS == 12
#define EACH_ROW_COUNT(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12)
#elif ROWS == 6
#define EACH_ROW_COUNT(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#else
#define EACH_ROW_COUNT(CASE) CASE(1) CASE(2) CASE(3) CASE(4)
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef uint8_t vb __attribute__((vector_size(VL)));
typedef int8_t vs __attribute__((vector_size(VL)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
#define GROUP 32 /* inputs per group of codes (4- and 8-bit) */
#define Q4K 44 /* `bits` of 4-bit codes with fp32 d and m per group (GGUF Q4_K's form) */
#define Q6M 66 /* `bits` of 8-bit codes with fp32 d and m per 16 inputs (Q4_K's and Q6_K's groups alike) */
#define GROUP_OF(bits) ((bits) == 6 || (bits) == Q6M ? 16 : GROUP)
#define FOUR_BIT(bits) ((bits) == 4 || (bits) == Q4K)
#define HAS_M(bits) (FOUR_BIT(bits) || (bits) == Q6M)
#define FP32_SCALES(bits) ((bits) == 6 || (bits) == Q4K || (bits) == Q6M)

/* A thread streams each panel from memory once, in order, but a tile of few rows does so little arithmetic per byte
   that the CPU's own prefetcher falls behind on some hosts (a one-row step then ran at a fraction of the memory's
   speed): each tile asks for the bytes AHEAD beyond those it reads now. A hint only: it changes no value. */
#define AHEAD 4096
static inline __attribute__((always_inline)) void prefetch_bytes(const void *p, int bytes) {
    for (int line = 0; line < bytes; line += 64) __builtin_prefetch((const char *)p + line);
}

static inline vf loadv(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* one k of a coded panel as the codes of its two vectors of columns, as floats: 4-bit codes are VL bytes (byte j:
   column j in its low nibble, column VL + j in its high one), 8-bit codes PANEL signed bytes (GCC lowers a generic
   byte-to-float vector conversion one lane at a time, hence the intrinsics; 6-bit codes are stored as 8-bit ones).
   With AVX-512 a 4-bit code becomes its float by a lookup in a register of the 16 values (a permute reads only an
   index's low 4 bits, so the low nibble needs no mask): on few rows the kernel is bound by these instructions, not by
   memory, and this takes one fewer. */
static inline __attribute__((always_inline)) void codes_of(const int bits, const uint8_t *p, vf *low, vf *high) {
#if defined(__AVX512F__)
    if (FOUR_BIT(bits)) {
        const __m512 values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
        *low = (vf)_mm512_permutexvar_ps(c, values);
        *high = (vf)_mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), values);
    } else {
        *low = (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
        *high = (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + VL))));
    }
#elif defined(__AVX2__)
    if (FOUR_BIT(bits)) {
        __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
        *low = (vf)_mm256_cvtepi32_ps(_mm256_and_si256(c, _mm256_set1_epi32(15)));
        *high = (vf)_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4));
    } else {
        *low = (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
        *high = (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + VL))));
    }
#else
    if (FOUR_BIT(bits)) {
        vb b;
        memcpy(&b, p, sizeof b);
        vi c = __builtin_convertvector(b, vi);
        *low = __builtin_convertvector(c & 15, vf);
        *high = __builtin_convertvector(c >> 4, vf);
    } else {
        vs a, b;
        memcpy(&a, p, sizeof a);
        memcpy(&b, p + VL, sizeof b);
        *low = __builtin_convertvector(__builtin_convertvector(a, vi), vf);
        *high = __builtin_convertvector(__builtin_convertvector(b, vi), vf);
    }
#endif
}

/* bytes of codes per k of a panel, and 16-bit words of scales per group: fp16 d of the PANEL columns (then their m
   for 4-bit codes), or their fp32 d for 6-bit codes (then their fp32 m for Q4K and Q6M) */
#define CODE_BYTES(bits) (FOUR_BIT(bits) ? VL : PANEL)
#define SCALE_COUNT(bits) ((bits) == 8 ? PANEL : (bits) == Q4K || (bits) == Q6M ? 4 * PANEL : 2 * PANEL)

/* an fp16 value as fp32 (exact: every fp16 value is an fp32 value) */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 31, mantissa = h & 1023, bits;
    if (exponent == 31) /* infinity or NaN */
        bits = sign | 0x7f800000 | (mantissa << 13);
    else if (exponent) /* normal */
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    else if (mantissa) { /* subnormal: normalise */
        exponent = 113;
        while (!(mantissa & 1024)) mantissa <<= 1, exponent--;
        bits = sign | (exponent << 23) | ((mantissa & 1023) << 13);
    } else
        bits = sign;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* VL fp16 values as floats (F16C's conversion where the host has it; it is exact, as is half_to_float) */
static inline vf load_halves(const uint16_t *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__AVX2__) && defined(__F16C__)
    return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    float f[VL];
    for (int i = 0; i < VL; i++) f[i] = half_to_float(p[i]);
    return loadv(f);
#endif
}

/* a group's scales of a coded panel: d of the two vectors of columns, and m (zero for 8-bit codes) */
typedef struct {
    vf d0, d1, m0, m1;
} group_scales;

static inline __attribute__((always_inline)) group_scales scales_of(const int bits, const uint16_t *scales, int64_t g) {
    const uint16_t *s = scales + g * SCALE_COUNT(bits);
    if (FP32_SCALES(bits)) {
        const float *f = (const float *)s;
        group_scales c = {loadv(f), loadv(f + VL), (vf){0}, (vf){0}};
        if (HAS_M(bits)) c.m0 = loadv(f + PANEL), c.m1 = loadv(f + PANEL + VL);
        return c;
    }
    group_scales c = {load_halves(s), load_halves(s + VL), (vf){0}, (vf){0}};
    if (bits == 4) c.m0 = load_halves(s + PANEL), c.m1 = load_halves(s + PANEL + VL);
    return c;
}

/* the fp32 weights of input k of a coded panel (its two vectors of columns), exactly: d q + m rounds once */
static inline __attribute__((always_inline)) void weights_of(const int bits, const uint8_t *codes, int64_t k,
                                                             const group_scales *c, vf *w0, vf *w1) {
    vf q0, q1;
    codes_of(bits, codes + k * CODE_BYTES(bits), &q0, &q1);
    *w0 = HAS_M(bits) ? q0 * c->d0 + c->m0 : q0 * c->d0;
    *w1 = HAS_M(bits) ? q1 * c->d1 + c->m1 : q1 * c->d1;
}

/* the fp32 weights of group g's inputs of a coded panel into w (the fp32 panel layout), the panel's bytes ahead asked
   for as they stream from memory */
static inline __attribute__((always_inline)) void rebuild_group(const int bits, const uint8_t *codes,
                                                                const uint16_t *scales, int64_t g, float *w) {
    const int64_t group = GROUP_OF(bits);
    group_scales c = scales_of(bits, scales, g);
    prefetch_bytes(codes + g * group * CODE_BYTES(bits) + AHEAD, group * CODE_BYTES(bits));
    for (int64_t k = g * group; k < (g + 1) * group; k++) {
        vf w0, w1;
        weights_of(bits, codes, k, &c, &w0, &w1);
        memcpy(w + (k - g * group) * PANEL, &w0, sizeof w0);
        memcpy(w + (k - g * group) * PANEL + VL, &w1, sizeof w1);
    }
}

int64_t panel_width(void) { return PANEL; }

/* the accumulators of R rows into R rows of y (+ bias) */
static inline __attribute__((always_inline)) void store_rows(const int R, const vf *lo, const vf *hi,
                                                             const float *bias, float *y, int64_t ldy, int64_t cols) {
    if (cols == PANEL) { /* a whole panel: vector stores (a memcpy of a variable length is a library call) */
        vf b0 = bias ? loadv(bias) : (vf){0}, b1 = bias ? loadv(bias + VL) : (vf){0};
        for (int r = 0; r < R; r++) {
            vf o0 = bias ? lo[r] + b0 : lo[r], o1 = bias ? hi[r] + b1 : hi[r];
            memcpy(y + r * ldy, &o0, sizeof o0);
            memcpy(y + r * ldy + VL, &o1, sizeof o1);
        }
        return;
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

/* R rows (a constant after inlining, so the accumulators stay in registers) times one panel; `streamed`: the panel
   comes from memory (the first tile to read it), so the bytes ahead are asked for */
static inline __attribute__((always_inline)) void tile(const int R, const int streamed, int64_t K, const float *x,
                                                       int64_t ldx, const float *w, const float *bias, float *y,
                                                       int64_t ldy, int64_t cols) {
    vf lo[ROWS], hi[ROWS];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = (vf){0};
    for (int64_t k = 0; k < K; k++) {
        if (streamed) prefetch_bytes(w + k * PANEL + AHEAD / 4, PANEL * 4);
        vf w0 = loadv(w + k * PANEL), w1 = loadv(w + k * PANEL + VL);
        for (int r = 0; r < R; r++) {
            float xr = x[r * ldx + k];
            lo[r] += w0 * xr;
            hi[r] += w1 * xr;
        }
    }
    store_rows(R, lo, hi, bias, y, ldy, cols);
}

/* the same for a coded panel, each weight rebuilt in registers as the sum reaches it */
static inline __attribute__((always_inline)) void coded_tile(const int bits, const int R, const int streamed,
                                                             int64_t K, const float *x, int64_t ldx,
                                                             const uint8_t *codes, const uint16_t *scales,
                                                             const float *bias, float *y, int64_t ldy, int64_t cols) {
    vf lo[ROWS], hi[ROWS];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = (vf){0};
    const int group = GROUP_OF(bits), group_bytes = group * CODE_BYTES(bits), ahead = AHEAD / group_bytes; /* groups */
    for (int64_t g = 0; g < K / group; g++) {
        group_scales c = scales_of(bits, scales, g);
        if (streamed) {
            prefetch_bytes(codes + (g + ahead) * group_bytes, group_bytes);
            prefetch_bytes(scales + (g + ahead) * SCALE_COUNT(bits), SCALE_COUNT(bits) * 2);
        }
        for (int64_t k = g * group; k < (g + 1) * group; k++) {
            vf w0, w1;
            weights_of(bits, codes, k, &c, &w0, &w1);
            for (int r = 0; r < R; r++) {
                float xr = x[r * ldx + k];
                lo[r] += w0 * xr;
                hi[r] += w1 * xr;
            }
        }
    }
    store_rows(R, lo, hi, bias, y, ldy, cols);
}

static void rows_times_coded_panel(int bits, int R, int streamed, int64_t K, const float *x, int64_t ldx,
                                   const uint8_t *codes, const uint16_t *scales, const float *bias, float *y,
                                   int64_t ldy, int64_t cols) {
    switch (R + 100 * (bits == 8) + 200 * (bits == 6) + 300 * (bits == Q4K) + 400 * (bits == Q6M) + 1000 * (streamed != 0)) {
#define CASE(n) \
    case n: coded_tile(4, n, 0, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 100: coded_tile(8, n, 0, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 200: coded_tile(6, n, 0, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 300: coded_tile(Q4K, n, 0, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 400: coded_tile(Q6M, n, 0, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 1000: coded_tile(4, n, 1, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 1100: coded_tile(8, n, 1, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 1200: coded_tile(6, n, 1, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 1300: coded_tile(Q4K, n, 1, K, x, ldx, codes, scales, bias, y, ldy, cols); break; \
    case n + 1400: coded_tile(Q6M, n, 1, K, x, ldx, codes, scales, bias, y, ldy, cols); break;
        EACH_ROW_COUNT(CASE)
#undef CASE
    }
}

static void rows_times_panel(int R, int streamed, int64_t K, const float *x, int64_t ldx, const float *w,
                             const float *bias, float *y, int64_t ldy, int64_t cols) {
    switch (R + 100 * (streamed != 0)) {
#define CASE(n) \
    case n: tile(n, 0, K, x, ldx, w, bias, y, ldy, cols); break; \
    case n + 100: tile(n, 1, K, x, ldx, w, bias, y, ldy, cols); break;
        EACH_ROW_COUNT(CASE)
#undef CASE
    }
}

/* panel_linear's panels, shared out between the threads of the enclosing parallel region */
/* all M rows times one fp32 panel w, ROWS at a time; `streamed`: the first tile reads w from memory */
static void all_rows_times_panel(int64_t M, int streamed, int64_t K, const float *x, int64_t ldx, const float *w,
                                 const float *bias, float *y, int64_t ldy, int64_t cols) {
    for (int64_t m = 0; m < M; m += ROWS) {
        int R = M - m < ROWS ? (int)(M - m) : ROWS;
        rows_times_panel(R, streamed && m == 0, K, x + m * ldx, ldx, w, bias, y + m * ldy, ldy, cols);
    }
}

static void panel_rows(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const float *panels,
                       const float *bias, float *y, int64_t ldy) {
    int64_t count = (N + PANEL - 1) / PANEL;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < count; p++) {
        int64_t first = p * PANEL, cols = N - first < PANEL ? N - first : PANEL;
        all_rows_times_panel(M, 1, K, x, ldx, panels + p * K * PANEL, bias ? bias + first : 0, y + first, ldy, cols);
    }
}

/* x: M rows of K floats, ldx apart; panels: as packed by kernels/native_linear.py; bias: N floats or NULL; y: M rows
   of N floats, ldy apart; threads: how many OpenMP threads to use (torch's setting, passed in: a thread's OpenMP
   default need not be torch's). */
void panel_linear(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const float *panels,
                  const float *bias, float *y, int64_t ldy, int64_t threads) {
#pragma omp parallel num_threads(threads)
    panel_rows(M, N, K, x, ldx, panels, bias, y, ldy);
}

/* coded_panel_linear's panels, shared out between the threads of the enclosing parallel region. Up to CODED_TILES
   tiles' worth of rows go through as few tiles of equal size as hold them, each rebuilding the weights in registers
   from the panel's codes (the first from memory, the others from the cache). More rows would rebuild each weight once
   per tile, so each panel is then rebuilt once into an fp32 buffer of the thread and multiplied from there. */
#define CODED_TILES 4
static void coded_panel_rows(int64_t bits, int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx,
                             const uint8_t *codes, const uint16_t *scales, const float *bias, float *y, int64_t ldy) {
    int64_t count = (N + PANEL - 1) / PANEL, code_bytes = K * CODE_BYTES(bits);
    int64_t group = GROUP_OF(bits), scale_count = K / group * SCALE_COUNT(bits), tiles = (M + ROWS - 1) / ROWS;
    if (tiles <= CODED_TILES) {
#pragma omp for schedule(static)
        for (int64_t p = 0; p < count; p++) {
            int64_t first = p * PANEL, cols = N - first < PANEL ? N - first : PANEL;
            for (int64_t t = 0; t < tiles; t++) {
                int64_t m = M * t / tiles;
                int R = (int)(M * (t + 1) / tiles - m);
                rows_times_coded_panel((int)bits, R, t == 0, K, x + m * ldx, ldx, codes + p * code_bytes,
                                       scales + p * scale_count, bias ? bias + first : 0, y + m * ldy + first, ldy,
                                       cols);
            }
        }
        return;
    }
    float *w = malloc(K * PANEL * sizeof(float));
#pragma omp for schedule(static)
    for (int64_t p = 0; p < count; p++) {
        int64_t first = p * PANEL, cols = N - first < PANEL ? N - first : PANEL;
        for (int64_t g = 0; g < K / group; g++)
            if (bits == 4)
                rebuild_group(4, codes + p * code_bytes, scales + p * scale_count, g, w + g * group * PANEL);
            else if (bits == 8)
                rebuild_group(8, codes + p * code_bytes, scales + p * scale_count, g, w + g * group * PANEL);
            else if (bits == Q4K)
                rebuild_group(Q4K, codes + p * code_bytes, scales + p * scale_count, g, w + g * group * PANEL);
            else if (bits == Q6M)
                rebuild_group(Q6M, codes + p * code_bytes, scales + p * scale_count, g, w + g * group * PANEL);
            else
                rebuild_group(6, codes + p * code_bytes, scales + p * scale_count, g, w + g * group * PANEL);
        all_rows_times_panel(M, 0, K, x, ldx, w, bias ? bias + first : 0, y + first, ldy, cols);
    }
    free(w);
}

/* panel_linear's product from coded panels of `bits`-bit codes (4, 8, 6: 8-bit codes with fp32 scales per 16
   inputs, Q4K: 4-bit codes with fp32 scales, or Q6M: 8-bit codes with fp32 d and m per 16 inputs; as packed by
   kernels/native_linear.py; K a multiple of the group) */
void coded_panel_linear(int64_t bits, int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx,
                        const uint8_t *codes, const uint16_t *scales, const float *bias, float *y, int64_t ldy,
                        int64_t threads) {
#pragma omp parallel num_threads(threads)
    coded_panel_rows(bits, M, N, K, x, ldx, codes, scales, bias, y, ldy);
}
