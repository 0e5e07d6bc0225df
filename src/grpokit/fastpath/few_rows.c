/* Few-row matrix products for CPU decoding: Y = W X^T for a weight W (N, K) and a handful of rows X (R, K), both
 * row-major float32, written as columns Y (N, R) (the column decode step's layout), plus an optional bias (N).
 *
 * A decode step multiplies each weight by one token per sequence: R is 8-64, so the product reads every weight once
 * for little arithmetic and its speed is how fast the weight streams in. General BLAS kernels (MKL here) read it at
 * about 11 GB/s on two cores for R = 16. This kernel reads each weight row once: every 16-float slice of it is
 * multiplied into 16 rows of X at once (16 accumulators in registers; X stays in the L1 cache, which is why callers
 * keep R x K small), the 16 sums are reduced together by one shuffle tree, and the rows read next are prefetched;
 * fewer than 16 rows go in blocks of up to 8, two weight rows at a time. That reaches 15-20 GB/s on the same cores.
 * Sums run in a different order than BLAS's: equal up to float rounding.
 *
 * Built by `few_rows.py` with the C compiler at hand, for x86-64 with AVX-512F; OpenMP threads share torch's pool.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define PREFETCH_PAIRS 2 /* prefetch the weight rows this many row pairs ahead */

/* Rows o and o + 1 of Y (ldy apart) for RB rows of X, (RB <= 8). */
#define PAIR_BLOCK(RB)                                                                                          \
    static void pair_##RB(const float *w, const float *X, float *y, int64_t ldy, const float *b, int64_t K) {  \
        __m512 a0[RB], a1[RB];                                                                                  \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) a0[r] = a1[r] = _mm512_setzero_ps();               \
        const float *w1 = w + K, *ahead = w + 2 * PREFETCH_PAIRS * K;                                           \
        int64_t k = 0;                                                                                          \
        for (; k + 16 <= K; k += 16) {                                                                          \
            __m512 v0 = _mm512_loadu_ps(w + k), v1 = _mm512_loadu_ps(w1 + k);                                   \
            _mm_prefetch((const char *)(ahead + k), _MM_HINT_T0);                                               \
            _mm_prefetch((const char *)(ahead + K + k), _MM_HINT_T0);                                           \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                              \
                __m512 x = _mm512_loadu_ps(X + r * K + k);                                                      \
                a0[r] = _mm512_fmadd_ps(v0, x, a0[r]);                                                          \
                a1[r] = _mm512_fmadd_ps(v1, x, a1[r]);                                                          \
            }                                                                                                   \
        }                                                                                                       \
        if (k < K) {                                                                                            \
            __mmask16 m = (__mmask16)((1u << (K - k)) - 1);                                                     \
            __m512 v0 = _mm512_maskz_loadu_ps(m, w + k), v1 = _mm512_maskz_loadu_ps(m, w1 + k);                 \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                              \
                __m512 x = _mm512_maskz_loadu_ps(m, X + r * K + k);                                             \
                a0[r] = _mm512_fmadd_ps(v0, x, a0[r]);                                                          \
                a1[r] = _mm512_fmadd_ps(v1, x, a1[r]);                                                          \
            }                                                                                                   \
        }                                                                                                       \
        float b0 = b ? b[0] : 0.0f, b1 = b ? b[1] : 0.0f;                                                       \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                                  \
            y[r] = _mm512_reduce_add_ps(a0[r]) + b0;                                                            \
            y[ldy + r] = _mm512_reduce_add_ps(a1[r]) + b1;                                                      \
        }                                                                                                       \
    }

/* Row o of Y alone (the last one when N is odd). */
#define ROW_BLOCK(RB)                                                                                           \
    static void row_##RB(const float *w, const float *X, float *y, int64_t ldy, const float *b, int64_t K) {   \
        (void)ldy;                                                                                              \
        __m512 a0[RB];                                                                                          \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) a0[r] = _mm512_setzero_ps();                       \
        int64_t k = 0;                                                                                          \
        for (; k + 16 <= K; k += 16) {                                                                          \
            __m512 v0 = _mm512_loadu_ps(w + k);                                                                 \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                                                \
                a0[r] = _mm512_fmadd_ps(v0, _mm512_loadu_ps(X + r * K + k), a0[r]);                            \
        }                                                                                                       \
        if (k < K) {                                                                                            \
            __mmask16 m = (__mmask16)((1u << (K - k)) - 1);                                                     \
            __m512 v0 = _mm512_maskz_loadu_ps(m, w + k);                                                        \
            _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                                                \
                a0[r] = _mm512_fmadd_ps(v0, _mm512_maskz_loadu_ps(m, X + r * K + k), a0[r]);                    \
        }                                                                                                       \
        float b0 = b ? b[0] : 0.0f;                                                                             \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) y[r] = _mm512_reduce_add_ps(a0[r]) + b0;           \
    }

PAIR_BLOCK(1) PAIR_BLOCK(2) PAIR_BLOCK(3) PAIR_BLOCK(4) PAIR_BLOCK(5) PAIR_BLOCK(6) PAIR_BLOCK(7) PAIR_BLOCK(8)
ROW_BLOCK(1) ROW_BLOCK(2) ROW_BLOCK(3) ROW_BLOCK(4) ROW_BLOCK(5) ROW_BLOCK(6) ROW_BLOCK(7) ROW_BLOCK(8)

/* Lane r of the result: the sum of a[r]'s lanes (a shuffle tree, then the lanes put in row order). */
static inline __m512 sum_lanes_16(const __m512 *a) {
    __m512 t[8], u[4], v[2];
    for (int i = 0; i < 8; i++) /* 128-bit quarters 0, 1 of a[i] and a[i + 8] plus quarters 2, 3 */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[i], a[i + 8], 0x44), _mm512_shuffle_f32x4(a[i], a[i + 8], 0xEE));
    for (int i = 0; i < 4; i++)
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[i], t[i + 4], 0x88), _mm512_shuffle_f32x4(t[i], t[i + 4], 0xDD));
    for (int i = 0; i < 2; i++)
        v[i] = _mm512_add_ps(_mm512_unpacklo_ps(u[i], u[i + 2]), _mm512_unpackhi_ps(u[i], u[i + 2]));
    __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x44), _mm512_shuffle_ps(v[0], v[1], 0xEE));
    /* the tree leaves row r's sum in lane LANE[r] */
    const __m512i lane = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    return _mm512_permutexvar_ps(lane, sums);
}

/* Row o of Y for 16 rows of X. */
static void row_16(const float *w, const float *X, float *y, const float *b, int64_t K) {
    __m512 a[16];
    _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) a[r] = _mm512_setzero_ps();
    const float *ahead = w + 2 * PREFETCH_PAIRS * K;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 v = _mm512_loadu_ps(w + k);
        _mm_prefetch((const char *)(ahead + k), _MM_HINT_T0);
        _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++) a[r] = _mm512_fmadd_ps(v, _mm512_loadu_ps(X + r * K + k), a[r]);
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, w + k);
        _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++)
            a[r] = _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(m, X + r * K + k), a[r]);
    }
    _mm512_storeu_ps(y, _mm512_add_ps(sum_lanes_16(a), _mm512_set1_ps(b ? b[0] : 0.0f)));
}

/* exp of 16 floats: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by Cephes' degree-6 polynomial (about 1 ulp), times 2^n
 * by scalef (which saturates to 0 and infinity beyond float's range). */
static inline __m512 exp_16(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* silu(a) * b, lane by lane: a / (1 + exp(-a)) * b. */
static inline __m512 silu_mul_16(__m512 a, __m512 b) {
    __m512 one = _mm512_set1_ps(1.0f);
    return _mm512_mul_ps(_mm512_div_ps(a, _mm512_add_ps(one, exp_16(_mm512_sub_ps(_mm512_setzero_ps(), a)))), b);
}

typedef void (*block_fn)(const float *, const float *, float *, int64_t, const float *, int64_t);
static const block_fn PAIRS[9] = {0, pair_1, pair_2, pair_3, pair_4, pair_5, pair_6, pair_7, pair_8};
static const block_fn ROWS[9] = {0, row_1, row_2, row_3, row_4, row_5, row_6, row_7, row_8};

/* Y (N, R) = W (N, K) @ X (R, K)^T (+ bias (N) on every column); `threads` OpenMP threads. */
void few_rows_mm(const float *W, const float *X, float *Y, const float *bias, int64_t N, int64_t K, int64_t R,
                 int threads) {
    int64_t sixteens = R / 16 * 16, pairs = (N + 1) / 2;
    if (sixteens) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t o = 0; o < N; o++)
            for (int64_t r0 = 0; r0 < sixteens; r0 += 16) row_16(W + o * K, X + r0 * K, Y + o * R + r0, bias ? bias + o : 0, K);
    }
    if (sixteens == R) return;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < pairs; p++) {
        int64_t o = 2 * p;
        const block_fn *blocks = o + 1 < N ? PAIRS : ROWS;
        for (int64_t r0 = sixteens; r0 < R; r0 += 8) {
            int64_t rb = R - r0 < 8 ? R - r0 : 8;
            blocks[rb](W + o * K, X + r0 * K, Y + o * R + r0, R, bias ? bias + o : 0, K);
        }
    }
}

/* RMS normalisation of R rows of K floats, as the model's RMSNorm computes it in float32:
 * Y[r] = w * (X[r] / sqrt(mean(X[r]^2) + eps)). One thread: a decode step's rows are too few to share. */
void few_rows_rms_norm(const float *X, const float *w, float *Y, int64_t R, int64_t K, float eps) {
    for (int64_t r = 0; r < R; r++) {
        const float *x = X + r * K;
        float *y = Y + r * K;
        __m512 acc = _mm512_setzero_ps();
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) {
            __m512 v = _mm512_loadu_ps(x + k);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        if (k < K) {
            __m512 v = _mm512_maskz_loadu_ps((__mmask16)((1u << (K - k)) - 1), x + k);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float scale = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)K + eps);
        __m512 s = _mm512_set1_ps(scale);
        for (k = 0; k + 16 <= K; k += 16)
            _mm512_storeu_ps(y + k, _mm512_mul_ps(_mm512_loadu_ps(w + k), _mm512_mul_ps(_mm512_loadu_ps(x + k), s)));
        if (k < K) {
            __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + k), _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), s));
            _mm512_mask_storeu_ps(y + k, m, v);
        }
    }
}

/* The gated MLP's first half for 16k rows: H (R, N) row-major = silu(X Wg^T) * (X Wu^T), for Wg, Wu (N, K) and X
 * (R, K), R a multiple of 16. Each row of Wg and of Wu is read once; H comes out in the rows the down projection
 * multiplies, so neither product's columns nor their transpose is ever stored. */
void few_rows_gated(const float *Wg, const float *Wu, const float *X, float *H, int64_t N, int64_t K, int64_t R,
                    int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t o = 0; o < N; o++) {
        for (int64_t r0 = 0; r0 < R; r0 += 16) {
            float g[16], u[16];
            row_16(Wg + o * K, X + r0 * K, g, 0, K);
            row_16(Wu + o * K, X + r0 * K, u, 0, K);
            float h[16];
            _mm512_storeu_ps(h, silu_mul_16(_mm512_loadu_ps(g), _mm512_loadu_ps(u)));
            for (int r = 0; r < 16; r++) H[(r0 + r) * N + o] = h[r];
        }
    }
}

/* silu of 16 floats at a time (for tests of exp_16 and silu_mul_16): Y[i] = silu(A[i]) * B[i], n a multiple of 16. */
void few_rows_silu_mul(const float *A, const float *B, float *Y, int64_t n) {
    for (int64_t i = 0; i + 16 <= n; i += 16)
        _mm512_storeu_ps(Y + i, silu_mul_16(_mm512_loadu_ps(A + i), _mm512_loadu_ps(B + i)));
}
