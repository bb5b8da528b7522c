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

void fs_paged_decode_attention(const float *q, const float *k, const float *v,
                               const int64_t *block_tables, const int64_t *context_lens,
                               float *out, int64_t B, int64_t H, int64_t KVH, int64_t D,
                               int64_t block_size, int64_t max_blocks, int64_t window,
                               float scale) {
    const int64_t group = H / KVH;
    int64_t max_len = 0;
    for (int64_t b = 0; b < B; b++)
        if (context_lens[b] > max_len) max_len = context_lens[b];
#pragma omp parallel
    {
        float *scores = (float *)malloc(sizeof(float) * (size_t)(group * (max_len > 0 ? max_len : 1)));
        float *acc = (float *)malloc(sizeof(float) * (size_t)(group * D));
#pragma omp for collapse(2) schedule(static)
        for (int64_t b = 0; b < B; b++) {
            for (int64_t h = 0; h < KVH; h++) {
                const int64_t len = context_lens[b];
                const int64_t start = (window > 0 && len > window) ? len - window : 0;
                const int64_t n = len - start;
                const int64_t *table = block_tables + b * max_blocks;
                const float *qh = q + (b * H + h * group) * D;
                for (int64_t t = 0; t < n; t++) {
                    const int64_t pos = start + t;
                    const float *kp = k + ((table[pos / block_size] * block_size
                                            + pos % block_size) * KVH + h) * D;
                    for (int64_t g = 0; g < group; g++) {
                        const float *qg = qh + g * D;
                        float s = 0.0f;
                        for (int64_t d = 0; d < D; d++) s += qg[d] * kp[d];
                        scores[g * n + t] = s * scale;
                    }
                }
                for (int64_t g = 0; g < group; g++) {
                    float *sg = scores + g * n;
                    float m = -FLT_MAX;  /* finite: built with -ffast-math */
                    for (int64_t t = 0; t < n; t++) m = sg[t] > m ? sg[t] : m;
                    float sum = 0.0f;
                    for (int64_t t = 0; t < n; t++) {
                        sg[t] = expf(sg[t] - m);
                        sum += sg[t];
                    }
                    const float inv = 1.0f / sum;
                    for (int64_t t = 0; t < n; t++) sg[t] *= inv;
                    for (int64_t d = 0; d < D; d++) acc[g * D + d] = 0.0f;
                }
                for (int64_t t = 0; t < n; t++) {
                    const int64_t pos = start + t;
                    const float *vp = v + ((table[pos / block_size] * block_size
                                            + pos % block_size) * KVH + h) * D;
                    for (int64_t g = 0; g < group; g++) {
                        const float p = scores[g * n + t];
                        float *ag = acc + g * D;
                        for (int64_t d = 0; d < D; d++) ag[d] += p * vp[d];
                    }
                }
                for (int64_t g = 0; g < group; g++) {
                    float *o = out + (b * H + h * group + g) * D;
                    for (int64_t d = 0; d < D; d++) o[d] = acc[g * D + d];
                }
            }
        }
        free(scores);
        free(acc);
    }
}
