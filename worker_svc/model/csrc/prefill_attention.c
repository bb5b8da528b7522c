/* Prefill attention read in place from a paged KV pool (float32, CPU).
 *
 * One job's new tokens (a prompt, or a chunk of one after earlier chunks) attend causally to
 * every cached token of the job, the new ones included (their keys and values are already in
 * the pool), optionally within a sliding window. Flash-attention style: each task takes one
 * KV head and a tile of query tokens (all the query heads that share that KV head, so every
 * key and value read serves group x tokens rows), walks the keys in tiles with an online
 * softmax (running max and sum, float32), and never forms the whole score matrix. Key tiles
 * past a tile's last query position are skipped, so causal prefill does half the work of a
 * full one. The two small matrix products per key tile are written as register-blocked outer
 * products that the compiler vectorizes (-O3 -march=native); the head size 64 of most small
 * Llamas has its own constant-size copy of them.
 *
 * Layouts:
 *   q:        n rows of H x D floats, rows q_stride floats apart (a view of the fused QKV)
 *   out:      [n, H, D] contiguous
 *   k, v:     [num_blocks, block_size, KVH, D] contiguous (one layer of the pool)
 *   table:    the job's block ids, int64
 * Query token i sits at position ctx_len - n + i and attends to positions
 * [max(0, pos - window + 1), pos] (window 0 = no window).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "exp512.h"

#define QTOK 16 /* query tokens per task */
#define KT 32   /* keys per tile */
#define RB 4    /* rows per register block */

typedef struct {
    const float *k, *v;
    const int64_t *table;
    int64_t block_size, KVH, D, h;
} kv_view;

static inline const float *kv_row(const float *base, const kv_view *kv, int64_t pos) {
    return base + ((kv->table[pos / kv->block_size] * kv->block_size + pos % kv->block_size)
                   * kv->KVH + kv->h) * kv->D;
}

/* s[r][j] = q[r] . k[j] for R rows against one key tile given transposed (kt[d][j]). */
static inline __attribute__((always_inline)) void scores_tile(
        const float *restrict q, const float *restrict kt, int64_t kt_stride,
        float *restrict s, int64_t R, const int64_t D) {
    int64_t r = 0;
    for (; r + RB <= R; r += RB) {
        float acc[RB][KT];
        for (int i = 0; i < RB; i++)
            for (int j = 0; j < KT; j++) acc[i][j] = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            const float *kd = kt + d * kt_stride;
            for (int i = 0; i < RB; i++) {
                const float a = q[(r + i) * D + d];
                for (int j = 0; j < KT; j++) acc[i][j] += a * kd[j];
            }
        }
        for (int i = 0; i < RB; i++)
            for (int j = 0; j < KT; j++) s[(r + i) * KT + j] = acc[i][j];
    }
    for (; r < R; r++) {
        float acc[KT];
        for (int j = 0; j < KT; j++) acc[j] = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            const float a = q[r * D + d];
            const float *kd = kt + d * kt_stride;
            for (int j = 0; j < KT; j++) acc[j] += a * kd[j];
        }
        for (int j = 0; j < KT; j++) s[r * KT + j] = acc[j];
    }
}

/* o[r] += sum_j p[r][j] v[j] for R rows over one value tile of kb rows. */
static inline __attribute__((always_inline)) void values_tile(
        const float *restrict p, const float *const *vrows, float *restrict o, int64_t R,
        int64_t kb, const int64_t D) {
    int64_t r = 0;
    for (; r + RB <= R; r += RB) {
        for (int64_t j = 0; j < kb; j++) {
            const float *restrict vj = vrows[j];
            for (int i = 0; i < RB; i++) {
                const float w = p[(r + i) * KT + j];
                float *restrict orow = o + (r + i) * D;
                for (int64_t d = 0; d < D; d++) orow[d] += w * vj[d];
            }
        }
    }
    for (; r < R; r++)
        for (int64_t j = 0; j < kb; j++) {
            const float w = p[r * KT + j];
            const float *restrict vj = vrows[j];
            float *restrict orow = o + r * D;
            for (int64_t d = 0; d < D; d++) orow[d] += w * vj[d];
        }
}

#if defined(__AVX512F__)
/* The head size 64 with AVX-512: scores in blocks of 8 rows x 32 keys (16 accumulators),
 * values in blocks of 4 rows x 64 (16 accumulators held across the whole tile). */
static void scores_tile64(const float *restrict q, const float *restrict kt,
                          int64_t kt_stride, float *restrict s, int64_t R) {
    int64_t r = 0;
    for (; r + 8 <= R; r += 8) {
        __m512 a[8][2];
        for (int i = 0; i < 8; i++) a[i][0] = a[i][1] = _mm512_setzero_ps();
        for (int d = 0; d < 64; d++) {
            const float *kd = kt + d * kt_stride;
            const __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16);
            for (int i = 0; i < 8; i++) {
                const __m512 qv = _mm512_set1_ps(q[(r + i) * 64 + d]);
                a[i][0] = _mm512_fmadd_ps(qv, k0, a[i][0]);
                a[i][1] = _mm512_fmadd_ps(qv, k1, a[i][1]);
            }
        }
        for (int i = 0; i < 8; i++) {
            _mm512_storeu_ps(s + (r + i) * KT, a[i][0]);
            _mm512_storeu_ps(s + (r + i) * KT + 16, a[i][1]);
        }
    }
    if (r < R) scores_tile(q + r * 64, kt, kt_stride, s + r * KT, R - r, 64);
}

static void values_tile64(const float *restrict p, const float *const *vrows,
                          float *restrict o, int64_t R, int64_t kb) {
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) {
        __m512 a[4][4];
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < 4; c++) a[i][c] = _mm512_loadu_ps(o + (r + i) * 64 + c * 16);
        for (int64_t j = 0; j < kb; j++) {
            const float *vj = vrows[j];
            const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16),
                         v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
            for (int i = 0; i < 4; i++) {
                const __m512 w = _mm512_set1_ps(p[(r + i) * KT + j]);
                a[i][0] = _mm512_fmadd_ps(w, v0, a[i][0]);
                a[i][1] = _mm512_fmadd_ps(w, v1, a[i][1]);
                a[i][2] = _mm512_fmadd_ps(w, v2, a[i][2]);
                a[i][3] = _mm512_fmadd_ps(w, v3, a[i][3]);
            }
        }
        for (int i = 0; i < 4; i++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + (r + i) * 64 + c * 16, a[i][c]);
    }
    if (r < R) values_tile(p + r * KT, vrows, o + r * 64, R - r, kb, 64);
}
#else
static void scores_tile64(const float *restrict q, const float *restrict kt,
                          int64_t kt_stride, float *restrict s, int64_t R) {
    scores_tile(q, kt, kt_stride, s, R, 64);
}

static void values_tile64(const float *restrict p, const float *const *vrows,
                          float *restrict o, int64_t R, int64_t kb) {
    values_tile(p, vrows, o, R, kb, 64);
}
#endif

/* One row's scores of a key tile, sr[0, KT), become its softmax weights under the running
 * max *m and sum *l: lanes outside [lo, hi) weigh 0, and the row's output so far is rescaled
 * when the max grows. Returns the factor the output must be multiplied by. */
#if defined(__AVX512F__)
static inline float softmax_step(float *sr, int64_t lo, int64_t hi, float *m, float *l) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i vlo = _mm512_set1_epi32((int)lo), vhi = _mm512_set1_epi32((int)hi);
    const __m512i i1 = _mm512_add_epi32(iota, _mm512_set1_epi32(16));
    const __mmask16 k0 = _mm512_cmpge_epi32_mask(iota, vlo) & _mm512_cmplt_epi32_mask(iota, vhi);
    const __mmask16 k1 = _mm512_cmpge_epi32_mask(i1, vlo) & _mm512_cmplt_epi32_mask(i1, vhi);
    const __m512 lowest = _mm512_set1_ps(-FLT_MAX);
    const __m512 s0 = _mm512_mask_loadu_ps(lowest, k0, sr);
    const __m512 s1 = _mm512_mask_loadu_ps(lowest, k1, sr + 16);
    float mx = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    mx = mx > *m ? mx : *m;
    const __m512 vm = _mm512_set1_ps(mx);
    const __m512 e0 = _mm512_maskz_mov_ps(k0, exp512(_mm512_sub_ps(s0, vm)));
    const __m512 e1 = _mm512_maskz_mov_ps(k1, exp512(_mm512_sub_ps(s1, vm)));
    _mm512_storeu_ps(sr, e0);
    _mm512_storeu_ps(sr + 16, e1);
    const float corr = *l > 0.0f ? expf(*m - mx) : 0.0f;
    *l = *l * corr + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
    *m = mx;
    return corr;
}
#else
static inline float softmax_step(float *sr, int64_t lo, int64_t hi, float *m, float *l) {
    float mx = *m;
    for (int64_t j = lo; j < hi; j++) mx = sr[j] > mx ? sr[j] : mx;
    float sum = 0.0f;
    for (int64_t j = 0; j < KT; j++) {
        sr[j] = (j >= lo && j < hi) ? expf(sr[j] - mx) : 0.0f;
        sum += sr[j];
    }
    const float corr = *l > 0.0f ? expf(*m - mx) : 0.0f;
    *l = *l * corr + sum;
    *m = mx;
    return corr;
}
#endif

typedef struct {
    float *q, *o, *m, *l, *s;
    const float **vrows;
} scratch;

/* One task: KV head h, query tokens [t0, t0 + nt) of the segment. Rows are ordered
 * token-major: row ti * group + gi is query head h * group + gi of token t0 + ti. kt holds
 * the head's keys transposed, [D][kt_stride], zero past the context. */
static void attend_tile(const float *q, int64_t q_stride, float *out, const float *kt,
                        int64_t kt_stride, const kv_view *kv, int64_t pos0, int64_t t0,
                        int64_t nt, int64_t H, int64_t window, float scale, scratch *w) {
    const int64_t D = kv->D, group = H / kv->KVH, R = nt * group;
    for (int64_t ti = 0; ti < nt; ti++)
        for (int64_t gi = 0; gi < group; gi++) {
            const float *src = q + (t0 + ti) * q_stride + (kv->h * group + gi) * D;
            float *dst = w->q + (ti * group + gi) * D;
            for (int64_t d = 0; d < D; d++) dst[d] = src[d] * scale;
        }
    memset(w->o, 0, sizeof(float) * (size_t)(R * D));
    for (int64_t r = 0; r < R; r++) {
        w->m[r] = -FLT_MAX; /* finite: built with -ffast-math */
        w->l[r] = 0.0f;
    }
    const int64_t first = pos0 + t0, last = pos0 + t0 + nt - 1;
    const int64_t k_lo = (window > 0 && first - window + 1 > 0) ? first - window + 1 : 0;
    for (int64_t j0 = k_lo / KT * KT; j0 <= last; j0 += KT) {
        const int64_t kb = last + 1 - j0 < KT ? last + 1 - j0 : KT;
        for (int64_t j = 0; j < kb; j++) w->vrows[j] = kv_row(kv->v, kv, j0 + j);
        if (D == 64)
            scores_tile64(w->q, kt + j0, kt_stride, w->s, R);
        else
            scores_tile(w->q, kt + j0, kt_stride, w->s, R, D);
        for (int64_t r = 0; r < R; r++) {
            const int64_t pos = first + r / group;
            float *sr = w->s + r * KT;
            const int64_t hi = pos - j0 + 1 < kb ? pos - j0 + 1 : kb;
            const int64_t lo = (window > 0 && pos - window + 1 - j0 > 0) ? pos - window + 1 - j0 : 0;
            if (hi <= lo) { /* this row sees none of the tile */
                memset(sr, 0, sizeof(float) * KT);
                continue;
            }
            const float corr = softmax_step(sr, lo, hi, &w->m[r], &w->l[r]);
            if (corr != 1.0f) {
                float *orow = w->o + r * D;
                for (int64_t d = 0; d < D; d++) orow[d] *= corr;
            }
        }
        if (D == 64)
            values_tile64(w->s, w->vrows, w->o, R, kb);
        else
            values_tile(w->s, w->vrows, w->o, R, kb, D);
    }
    for (int64_t ti = 0; ti < nt; ti++)
        for (int64_t gi = 0; gi < group; gi++) {
            const int64_t r = ti * group + gi;
            const float inv = 1.0f / w->l[r];
            float *dst = out + ((t0 + ti) * H + kv->h * group + gi) * D;
            const float *src = w->o + r * D;
            for (int64_t d = 0; d < D; d++) dst[d] = src[d] * inv;
        }
}

/* Returns 0, or -1 when scratch memory could not be had (then ``out`` is not all written and
 * the caller must compute the attention another way). */
int fs_prefill_attention(const float *q, int64_t q_stride, float *out, const float *k,
                         const float *v, const int64_t *table, int64_t n, int64_t ctx_len,
                         int64_t H, int64_t KVH, int64_t D, int64_t block_size,
                         int64_t window, float scale) {
    const int64_t group = H / KVH, tiles = (n + QTOK - 1) / QTOK, R = QTOK * group;
    const int64_t pos0 = ctx_len - n;
    const int64_t stride = (ctx_len + KT - 1) / KT * KT; /* whole key tiles, zero-padded */
    float *kt = (float *)malloc(sizeof(float) * (size_t)(KVH * D * stride));
    if (kt == NULL) return -1;
    int failed = 0;
#pragma omp parallel
    {
        /* Every KV head's keys transposed once, [KVH][D][stride], for all the tasks. */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < stride; t++)
            for (int64_t h = 0; h < KVH; h++) {
                const kv_view kv = {k, v, table, block_size, KVH, D, h};
                float *dst = kt + h * D * stride + t;
                if (t < ctx_len) {
                    const float *kr = kv_row(k, &kv, t);
                    for (int64_t d = 0; d < D; d++) dst[d * stride] = kr[d];
                } else {
                    for (int64_t d = 0; d < D; d++) dst[d * stride] = 0.0f;
                }
            }
        scratch w;
        w.q = (float *)malloc(sizeof(float) * (size_t)(R * D));
        w.o = (float *)malloc(sizeof(float) * (size_t)(R * D));
        w.m = (float *)malloc(sizeof(float) * (size_t)R);
        w.l = (float *)malloc(sizeof(float) * (size_t)R);
        w.s = (float *)malloc(sizeof(float) * (size_t)(R * KT));
        w.vrows = (const float **)malloc(sizeof(float *) * KT);
        const int ok = w.q && w.o && w.m && w.l && w.s && w.vrows;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
        /* The last query tiles see the most keys: hand them out first. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tiles * KVH; task++) {
            if (!ok) continue;
            const int64_t tile = tiles - 1 - task / KVH, h = task % KVH;
            const kv_view kv = {k, v, table, block_size, KVH, D, h};
            const int64_t t0 = tile * QTOK;
            const int64_t nt = n - t0 < QTOK ? n - t0 : QTOK;
            attend_tile(q, q_stride, out, kt + h * D * stride, stride, &kv, pos0, t0, nt, H,
                        window, scale, &w);
        }
        free(w.q);
        free(w.o);
        free(w.m);
        free(w.l);
        free(w.s);
        free(w.vrows);
    }
    free(kt);
    return failed ? -1 : 0;
}
