/* The decoder's elementwise steps fused, one pass over memory each (float32, CPU).
 *
 * In PyTorch each of these is several operators, each reading and writing the whole
 * activation: RMSNorm five (square, mean, add, rsqrt, two products), RoPE five (negate, cat,
 * two products, sum), SiLU-and-multiply two. In a prefill of a few hundred tokens they cost
 * about a tenth of the pass. Each function here reads its input once, from cache, and
 * computes in the same order of operations as transformers' Llama (float32 statistics, the
 * weight applied last), so only the summation order of the mean of squares differs.
 *
 * Rows go to PyTorch's OpenMP team (libgomp, see native.py) when there are enough of them to
 * pay for waking it; a decode-sized call runs on the calling thread.
 */
#include <math.h>
#include <stdint.h>

#define PARALLEL_ROWS 16

/* x[r] += delta[r] (when delta is given), then out[r] = w * (x[r] / rms(x[r])). */
void fs_add_rms_norm(float *x, const float *delta, const float *w, float *out, int64_t rows,
                     int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * dim;
        if (delta) {
            const float *dr = delta + r * dim;
            for (int64_t i = 0; i < dim; i++) xr[i] += dr[i];
        }
        float ss = 0.0f;
        for (int64_t i = 0; i < dim; i++) ss += xr[i] * xr[i];
        /* In double: with -ffast-math, 1/sqrtf would become an approximate reciprocal root. */
        const float inv = (float)(1.0 / sqrt((double)(ss / (float)dim + eps)));
        float *o = out + r * dim;
        for (int64_t i = 0; i < dim; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* gate_up [rows, 2 * inter] (gate then up) -> out [rows, inter] = silu(gate) * up. */
void fs_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        /* exp's argument capped below float overflow: no infinity under -ffast-math. */
        for (int64_t i = 0; i < inter; i++)
            o[i] = g[i] / (1.0f + expf(fminf(-g[i], 88.0f))) * u[i];
    }
}

/* Rotary embedding in place on the first `heads` heads of each row of x (row stride
 * `stride` floats), the rotate-half form: cos and sin are [max_positions, head_dim] tables,
 * positions [rows] index them. */
void fs_rope(float *x, int64_t stride, const float *cos_t, const float *sin_t,
             const int64_t *positions, int64_t rows, int64_t heads, int64_t head_dim) {
    const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (rows >= PARALLEL_ROWS)
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_t + positions[r] * head_dim, *s = sin_t + positions[r] * head_dim;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + r * stride + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                const float a = v[i], b = v[i + half];
                v[i] = a * c[i] + (-b) * s[i];
                v[i + half] = b * c[i + half] + a * s[i + half];
            }
        }
    }
}
