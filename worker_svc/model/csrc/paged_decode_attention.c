/* Decode attention read in place from a paged KV pool (float32, CPU).
 *
 * One query token per job. For job b and KV head h, the job's keys and values are read
 * straight from the pool blocks its block table names: no gather into a padded copy. Scores,
 * the softmax (max-subtracted, in float32) and the weighted sum of values are computed per
 * task (a job, or one KV head of a job when there are few jobs); OpenMP hands the tasks,
 * longest first, to the threads of the runtime PyTorch itself uses (the library is linked
 * against libgomp.so.1, which torch has already loaded).
 *
 * The work is a stream of reads (a job's keys and values, 1.5 KB per token per layer for the
 * default model) with a few multiply-adds per float, so the layout of the reads decides the
 * speed. A block's tokens are consecutive rows KVH x D floats wide, so each token's rows of a
 * task's heads are one contiguous read; the tokens are taken in chunks, every head of a chunk
 * while it is in cache, the next chunk fetched meanwhile. With AVX-512 and head size 64 each
 * head's query rows stay in registers over a chunk (scores64, values64); elsewhere the loops are
 * plain C for the compiler to vectorize.
 *
 * Layouts (all contiguous):
 *   q, out:        [B, H, D]
 *   k, v:          [num_blocks, block_size, KVH, D]   (one layer of the pool)
 *   block_tables:  [B, max_blocks] int64
 *   context_lens:  [B] int64, tokens in cache for each job, the new one included
 * A job attends to positions [max(0, len - window), len) (window 0 = no window).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "exp512.h"

/* Tokens ahead whose rows are fetched while this one is computed (the plain-C path). */
#define PREFETCH 8

static inline void prefetch_row(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}

/* Where each of a job's tokens [start, start + n) starts in one layer's pool (its row of KV
 * head 0; keys and values alike), worked out once so that no read below divides. */
static void token_offsets(const int64_t *table, int64_t start, int64_t n, int64_t block_size,
                          int64_t row, int64_t *offs) {
    for (int64_t t = 0, pos = start; t < n;) {
        const int64_t off = pos % block_size;
        int64_t at = (table[pos / block_size] * block_size + off) * row;
        for (int64_t j = off; j < block_size && t < n; j++, t++, pos++, at += row)
            offs[t] = at;
    }
}

/* The plain-C task: KV heads [h0, h1) of one job, their rows = (h1 - h0) x group queries at
 * q (contiguous), outputs at o; acc holds rows x D floats. D is a compile-time constant in
 * the head-size-64 copy. */
static inline __attribute__((always_inline)) void attend_plain(
        const float *q, const float *k, const float *v, const int64_t *restrict offs,
        int64_t n, int64_t h0, int64_t h1, int64_t group, const int64_t D, float scale,
        float *restrict scores, float *restrict acc, float *o) {
    const int64_t heads = h1 - h0, rows = heads * group, width = heads * D;
    for (int64_t t = 0; t < n; t++) {
        const float *kp = k + offs[t] + h0 * D;
        if (t + PREFETCH < n) prefetch_row(k + offs[t + PREFETCH] + h0 * D, width);
        for (int64_t hh = 0; hh < heads; hh++) {
            const float *restrict kr = kp + hh * D;
            for (int64_t g = 0; g < group; g++) {
                const int64_t r = hh * group + g;
                const float *restrict qr = q + r * D;
                float s = 0.0f;
                for (int64_t d = 0; d < D; d++) s += qr[d] * kr[d];
                scores[r * n + t] = s * scale;
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        float *sr = scores + r * n;
        float m = -FLT_MAX; /* finite: built with -ffast-math */
        for (int64_t t = 0; t < n; t++) m = sr[t] > m ? sr[t] : m;
        float sum = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            sr[t] = expf(sr[t] - m);
            sum += sr[t];
        }
        const float inv = 1.0f / sum;
        for (int64_t t = 0; t < n; t++) sr[t] *= inv;
        for (int64_t d = 0; d < D; d++) acc[r * D + d] = 0.0f;
    }
    for (int64_t t = 0; t < n; t++) {
        const float *vp = v + offs[t] + h0 * D;
        if (t + PREFETCH < n) prefetch_row(v + offs[t + PREFETCH] + h0 * D, width);
        for (int64_t hh = 0; hh < heads; hh++) {
            const float *restrict vr = vp + hh * D;
            for (int64_t g = 0; g < group; g++) {
                const int64_t r = hh * group + g;
                const float p = scores[r * n + t];
                float *restrict ar = acc + r * D;
                for (int64_t d = 0; d < D; d++) ar[d] += p * vr[d];
            }
        }
    }
    for (int64_t i = 0; i < rows * D; i++) o[i] = acc[i];
}

#if defined(__AVX512F__)
/* Keys or values of this many consecutive tokens are taken head by head while in cache: every
 * head's rows of a token are one contiguous read from memory, and each head's query rows stay
 * in registers over the chunk. */
#define CHUNK 32

/* Head size 64, R (1-4) query rows of one KV head (queries pre-scaled, qr), tokens [t0, t1):
 * scores[i * n + t] = q_i . k_t. The first head of a chunk fetches the next chunk's rows of
 * every head (pf_width floats per token). */
static inline __attribute__((always_inline)) void scores64(
        const float *restrict qr, const float *k, const int64_t *restrict offs, int64_t t0,
        int64_t t1, int64_t n, float *restrict scores, int64_t pf_width, const int R) {
    __m512 qv[4][4];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < 4; c++) qv[i][c] = _mm512_loadu_ps(qr + i * 64 + c * 16);
    for (int64_t t = t0; t < t1; t++) {
        const float *kp = k + offs[t];
        if (pf_width && t + CHUNK < n) prefetch_row(k + offs[t + CHUNK], pf_width);
        const __m512 k0 = _mm512_loadu_ps(kp), k1 = _mm512_loadu_ps(kp + 16),
                     k2 = _mm512_loadu_ps(kp + 32), k3 = _mm512_loadu_ps(kp + 48);
        for (int i = 0; i < R; i++) {
            __m512 a = _mm512_mul_ps(qv[i][0], k0);
            __m512 b = _mm512_mul_ps(qv[i][1], k1);
            a = _mm512_fmadd_ps(qv[i][2], k2, a);
            b = _mm512_fmadd_ps(qv[i][3], k3, b);
            scores[i * n + t] = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
        }
    }
}

/* acc (R x 64, in memory between chunks) += sum over tokens [t0, t1) of p_t v_t. */
static inline __attribute__((always_inline)) void values64(
        const float *restrict p, const float *v, const int64_t *restrict offs, int64_t t0,
        int64_t t1, int64_t n, float *restrict acc, int64_t pf_width, const int R) {
    __m512 a[4][4];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < 4; c++) a[i][c] = _mm512_loadu_ps(acc + i * 64 + c * 16);
    for (int64_t t = t0; t < t1; t++) {
        const float *vp = v + offs[t];
        if (pf_width && t + CHUNK < n) prefetch_row(v + offs[t + CHUNK], pf_width);
        const __m512 v0 = _mm512_loadu_ps(vp), v1 = _mm512_loadu_ps(vp + 16),
                     v2 = _mm512_loadu_ps(vp + 32), v3 = _mm512_loadu_ps(vp + 48);
        for (int i = 0; i < R; i++) {
            const __m512 w = _mm512_set1_ps(p[i * n + t]);
            a[i][0] = _mm512_fmadd_ps(w, v0, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(w, v1, a[i][1]);
            a[i][2] = _mm512_fmadd_ps(w, v2, a[i][2]);
            a[i][3] = _mm512_fmadd_ps(w, v3, a[i][3]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(acc + i * 64 + c * 16, a[i][c]);
}

/* One row's n scores become their softmax, in place. */
static void softmax_row(float *sr, int64_t n) {
    __m512 mx = _mm512_set1_ps(-FLT_MAX);
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(sr + t));
    float m = _mm512_reduce_max_ps(mx);
    for (; t < n; t++) m = sr[t] > m ? sr[t] : m;
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (t = 0; t < n; t += 16) {
        const __mmask16 live = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, sr + t), vm));
        _mm512_mask_storeu_ps(sr + t, live, e);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(live, e));
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (t = 0; t < n; t += 16) {
        const __mmask16 live = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
        _mm512_mask_storeu_ps(sr + t, live, _mm512_mul_ps(_mm512_maskz_loadu_ps(live, sr + t), inv));
    }
}

/* One pass over a task's tokens, chunk by chunk, every query row group (up to 4 rows of one KV
 * head) of a chunk in turn: the scores (values == 0: qs against the keys kv, into scores) or
 * the weighted values (scores against the values kv, into acc). */
static void pass64(int values, const float *qs, const float *kv, const int64_t *offs, int64_t n,
                   int64_t h0, int64_t h1, int64_t group, float *scores, float *acc) {
    const int64_t width = (h1 - h0) * 64;
    for (int64_t t = 0; t < n && t < CHUNK; t++) prefetch_row(kv + offs[t] + h0 * 64, width);
    for (int64_t t0 = 0; t0 < n; t0 += CHUNK) {
        const int64_t t1 = t0 + CHUNK < n ? t0 + CHUNK : n;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t r = 0; r < group; r += 4) {
                const int64_t row = (h - h0) * group + r, R = group - r >= 4 ? 4 : group - r;
                const float *kvh = kv + h * 64;
                float *sr = scores + row * n, *ar = acc + row * 64;
                const int64_t pf = (h == h0 && r == 0) ? width : 0;
#define ROWS_CASE(N)                                                                      \
    case N:                                                                               \
        if (values) values64(sr, kvh, offs, t0, t1, n, ar, pf, N);                        \
        else scores64(qs + row * 64, kvh, offs, t0, t1, n, sr, pf, N);                    \
        break;
                switch (R) { ROWS_CASE(4) ROWS_CASE(3) ROWS_CASE(2) default: ROWS_CASE(1) }
#undef ROWS_CASE
            }
    }
}

/* The AVX-512 task for head size 64, arguments as attend_plain's; qs and acc hold rows x 64
 * floats each. */
static void attend64(const float *q, const float *k, const float *v, const int64_t *offs,
                     int64_t n, int64_t h0, int64_t h1, int64_t group, float scale,
                     float *restrict scores, float *restrict qs, float *restrict acc,
                     float *o) {
    const int64_t rows = (h1 - h0) * group;
    for (int64_t i = 0; i < rows * 64; i++) {
        qs[i] = q[i] * scale;
        acc[i] = 0.0f;
    }
    pass64(0, qs, k, offs, n, h0, h1, group, scores, acc);
    for (int64_t i = 0; i < rows; i++) softmax_row(scores + i * n, n);
    pass64(1, qs, v, offs, n, h0, h1, group, scores, acc);
    for (int64_t i = 0; i < rows * 64; i++) o[i] = acc[i];
}
#endif

/* One task: KV heads [h0, h1) of job b. scratch holds 2 x H x D floats. */
static void attend(const float *q, const float *k, const float *v, const int64_t *table,
                   int64_t len, float *out, int64_t b, int64_t h0, int64_t h1, int64_t H,
                   int64_t KVH, int64_t D, int64_t block_size, int64_t window, float scale,
                   float *scores, float *scratch, int64_t *offs) {
    const int64_t group = H / KVH;
    const int64_t start = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - start;
    const float *qt = q + (b * H + h0 * group) * D; /* the task's rows are contiguous */
    float *o = out + (b * H + h0 * group) * D;
    token_offsets(table, start, n, block_size, KVH * D, offs);
#if defined(__AVX512F__)
    if (D == 64) {
        attend64(qt, k, v, offs, n, h0, h1, group, scale, scores, scratch + H * D, scratch, o);
        return;
    }
#endif
    if (D == 64)
        attend_plain(qt, k, v, offs, n, h0, h1, group, 64, scale, scores, scratch, o);
    else
        attend_plain(qt, k, v, offs, n, h0, h1, group, D, scale, scores, scratch, o);
}

void fs_paged_decode_attention(const float *q, const float *k, const float *v,
                               const int64_t *block_tables, const int64_t *context_lens,
                               float *out, int64_t B, int64_t H, int64_t KVH, int64_t D,
                               int64_t block_size, int64_t max_blocks, int64_t window,
                               float scale) {
    int64_t max_len = 1;
    for (int64_t b = 0; b < B; b++)
        if (context_lens[b] > max_len) max_len = context_lens[b];
    /* Whole jobs per task when there are enough of them for the threads (each token's keys
     * of all heads read at once); else one task per (job, KV head). */
    const int64_t split = B >= 2 * omp_get_max_threads() ? 1 : KVH;
    const int64_t heads_per_task = KVH / split;
    /* Jobs longest first, handed out one at a time: contexts differ, and a thread that drew
     * the short ones must not wait at the end for one that drew the long ones. */
    int64_t *order = (int64_t *)malloc(sizeof(int64_t) * (size_t)B);
    for (int64_t i = 0; i < B; i++) {
        int64_t j = i;
        for (; j > 0 && context_lens[order[j - 1]] < context_lens[i]; j--) order[j] = order[j - 1];
        order[j] = i;
    }
#pragma omp parallel
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(H * max_len));
        float *scratch = (float *)malloc(sizeof(float) * (size_t)(2 * H * D));
        int64_t *offs = (int64_t *)malloc(sizeof(int64_t) * (size_t)max_len);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < B * split; task++) {
            const int64_t b = order[task / split], h0 = (task % split) * heads_per_task;
            attend(q, k, v, block_tables + b * max_blocks, context_lens[b], out, b, h0,
                   h0 + heads_per_task, H, KVH, D, block_size, window, scale, scores, scratch,
                   offs);
        }
        free(offs);
        free(scores);
        free(scratch);
    }
    free(order);
}
