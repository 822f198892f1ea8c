/* 16-float lanes and the few lane-wise functions the kernels share (GCC/Clang vector extensions). Each is computed
   the same way in every lane, so a value's bits do not depend on which lane or row it sits in. */
#ifndef LEAPDECODE_LANES_H
#define LEAPDECODE_LANES_H
#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
#define LANES 16

static inline v16 load16(const float *p) {
    v16 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline float sum16(v16 x) { /* a fixed tree of halves: the same bits for the same lanes everywhere */
#if defined(__has_builtin) && __has_builtin(__builtin_shufflevector)
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    v8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
#else
    float t[16];
    memcpy(t, &x, sizeof t);
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) t[l] += t[l + w];
    return (t[0]);

#endif
}

static inline v16 select16(i16 mask, v16 a, v16 b) { /* a where mask, else b (C has no vector ?:) */
    return (v16)(((i16)a & mask) | ((i16)b & ~mask));
}

static inline v16 max16(v16 a, v16 b) { return select16(a > b, a, b); }

/* exp(x) for lanes x <= 0 (scores minus their maximum): Cephes' polynomial on r = x - n ln 2, times 2^n, in plain
   lane-wise arithmetic (no library call, so every lane of every row is computed alike). Within a few ulp of expf. */
static inline v16 exp16(v16 x) {
    const v16 low = (v16){0} - 87.0f, magic = (v16){0} + 12582912.0f; /* adding 1.5 * 2^23 rounds to an integer */
    x = select16(x < low, low, x);
    v16 n = (x * 1.44269504088896341f + magic) - magic;
    v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    v16 p = (v16){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i16 bits = (__builtin_convertvector(n, i16) + 127) << 23;
    return p * (v16)bits;
}

#endif
