/* Decode attention read in place from a paged KV pool (float32, CPU).
 *
 * One query token per job. For job b and KV head h, the job's keys and values are read
 * straight from the pool blocks its block table names: no gather into a padded copy. Scores,
 * the softmax (max-subtracted, in float32) and the weighted sum of values are computed per
 * (job, KV head) task; OpenMP spreads the tasks over the threads of the runtime PyTorch
 * itself uses (the library is linked against libgomp.so.1, which torch has already loaded).
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

/* Tokens ahead whose rows are fetched while this one is computed. */
#define PREFETCH 4

static inline void prefetch_row(const float *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}

/* The row of KV head h0 of the token at position pos, in one layer's pool. */
static inline const float *token_row(const float *base, const int64_t *table, int64_t pos,
                                     int64_t block_size, int64_t KVH, int64_t h0, int64_t D) {
    return base + ((table[pos / block_size] * block_size + pos % block_size) * KVH + h0) * D;
}

/* One task: job b, KV heads [h0, h1). Scores for the task's (heads x group) query rows,
 * then the softmax, then the values; each token's row of keys (and of values) for those
 * heads is one contiguous read. */
static void attend(const float *q, const float *k, const float *v, const int64_t *table,
                   int64_t len, float *out, int64_t b, int64_t h0, int64_t h1, int64_t H,
                   int64_t KVH, int64_t D, int64_t block_size, int64_t window, float scale,
                   float *scores, float *acc) {
    const int64_t group = H / KVH;
    const int64_t rows = (h1 - h0) * group; /* query rows of this task */
    const int64_t start = (window > 0 && len > window) ? len - window : 0;
    const int64_t n = len - start;
    const float *qt = q + (b * H + h0 * group) * D; /* rows are contiguous in q */
    for (int64_t t = 0; t < n; t++) {
        const int64_t pos = start + t;
        const float *kp = token_row(k, table, pos, block_size, KVH, h0, D);
        if (t + PREFETCH < n)
            prefetch_row(token_row(k, table, pos + PREFETCH, block_size, KVH, h0, D),
                         (h1 - h0) * D);
        for (int64_t r = 0; r < rows; r++) {
            const float *qr = qt + r * D;
            const float *kr = kp + (r / group) * D;
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += qr[d] * kr[d];
            scores[r * n + t] = s * scale;
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
        const int64_t pos = start + t;
        const float *vp = token_row(v, table, pos, block_size, KVH, h0, D);
        if (t + PREFETCH < n)
            prefetch_row(token_row(v, table, pos + PREFETCH, block_size, KVH, h0, D),
                         (h1 - h0) * D);
        for (int64_t r = 0; r < rows; r++) {
            const float p = scores[r * n + t];
            const float *vr = vp + (r / group) * D;
            float *ar = acc + r * D;
            for (int64_t d = 0; d < D; d++) ar[d] += p * vr[d];
        }
    }
    float *o = out + (b * H + h0 * group) * D;
    for (int64_t i = 0; i < rows * D; i++) o[i] = acc[i];
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
#pragma omp parallel
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(H * max_len));
        float *acc = (float *)malloc(sizeof(float) * (size_t)(H * D));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < B * split; task++) {
            const int64_t b = task / split, h0 = (task % split) * heads_per_task;
            attend(q, k, v, block_tables + b * max_blocks, context_lens[b], out, b, h0,
                   h0 + heads_per_task, H, KVH, D, block_size, window, scale, scores, acc);
        }
        free(scores);
        free(acc);
    }
}
