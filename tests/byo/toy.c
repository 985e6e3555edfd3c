/* A small kernel library as a user would bring it: plain C, no tirbyoc headers. */
#include <stdint.h>

static void dense(const float *x, const float *w, const float *b, float *y, int64_t m,
                  int64_t n, int64_t k, int relu) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = b ? b[j] : 0.0f;
            for (int64_t p = 0; p < k; p++) acc += x[i * k + p] * w[j * k + p];
            y[i * n + j] = relu && acc < 0.0f ? 0.0f : acc;
        }
}

/* y = x @ w.T + b: x [m, k], w [n, k], b [n], y [m, n] */
int toy_dense_bias(const float *x, const float *w, const float *b, float *y, int64_t m,
                   int64_t n, int64_t k) {
    if (m < 0 || n < 0 || k < 0) return 2;
    dense(x, w, b, y, m, n, k, 0);
    return 0;
}

/* y = relu(x @ w.T + b) */
int toy_dense_bias_relu(const float *x, const float *w, const float *b, float *y, int64_t m,
                        int64_t n, int64_t k) {
    if (m < 0 || n < 0 || k < 0) return 2;
    dense(x, w, b, y, m, n, k, 1);
    return 0;
}

/* y = relu(conv2d(x, w) + b), stride 1, dilation 1, one group, the same padding on every
 * side: x [batch, c, h, w] (NCHW), w [oc, kh, kw, c] (OHWI), y [batch, oc, oh, ow]. */
int toy_conv2d_bias_relu(const float *x, const float *w, const float *b, float *y,
                         int batch, int c, int h, int wd, int oc, int kh, int kw, int pad) {
    if (batch < 0 || c < 1 || oc < 1 || kh < 1 || kw < 1 || pad < 0) return 2;
    int oh = h + 2 * pad - kh + 1, ow = wd + 2 * pad - kw + 1;
    for (int n = 0; n < batch; n++)
        for (int o = 0; o < oc; o++)
            for (int i = 0; i < oh; i++)
                for (int j = 0; j < ow; j++) {
                    float acc = b[o];
                    for (int u = 0; u < kh; u++) {
                        int r = i + u - pad;
                        if (r < 0 || r >= h) continue;
                        for (int v = 0; v < kw; v++) {
                            int s = j + v - pad;
                            if (s < 0 || s >= wd) continue;
                            for (int ci = 0; ci < c; ci++)
                                acc += x[((int64_t)(n * c + ci) * h + r) * wd + s] *
                                       w[((int64_t)(o * kh + u) * kw + v) * c + ci];
                        }
                    }
                    y[((int64_t)(n * oc + o) * oh + i) * ow + j] = acc < 0.0f ? 0.0f : acc;
                }
    return 0;
}

/* A kernel that always fails with status 7 (for the error path). */
int toy_dense_fails(const float *x, const float *w, const float *b, float *y, int64_t m,
                    int64_t n, int64_t k) {
    (void)x; (void)w; (void)b; (void)y; (void)m; (void)n; (void)k;
    return 7;
}

/* y = x @ w.T + b, returning nothing. */
void toy_dense_bias_void(const float *x, const float *w, const float *b, float *y, long m,
                         long n, long k) {
    dense(x, w, b, y, m, n, k, 0);
}

/* Softmax over the last axis: x, y [rows, cols]. */
#include <math.h>
int toy_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t c = 0; c < cols; c++) mx = xr[c] > mx ? xr[c] : mx;
        for (int64_t c = 0; c < cols; c++) sum += (yr[c] = expf(xr[c] - mx));
        for (int64_t c = 0; c < cols; c++) yr[c] /= sum;
    }
    return 0;
}

/* Average pooling, NCHW, the same stride and padding on both axes, padding not counted. */
int toy_avg_pool2d(const float *x, float *y, int batch, int c, int h, int w, int kh, int kw,
                   int stride, int pad) {
    int oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
    for (int n = 0; n < batch * c; n++)
        for (int i = 0; i < oh; i++)
            for (int j = 0; j < ow; j++) {
                float acc = 0.0f;
                int count = 0;
                for (int u = 0; u < kh; u++)
                    for (int v = 0; v < kw; v++) {
                        int r = i * stride - pad + u, s = j * stride - pad + v;
                        if (r < 0 || r >= h || s < 0 || s >= w) continue;
                        acc += x[((int64_t)n * h + r) * w + s];
                        count++;
                    }
                y[((int64_t)n * oh + i) * ow + j] = acc / (float)count;
            }
    return 0;
}

/* Max pooling, NCHW, the same stride and padding on both axes (taps in the padding left
 * out; a NaN tap wins). */
int toy_max_pool2d(const float *x, float *y, int batch, int c, int h, int w, int kh, int kw,
                   int stride, int pad) {
    int oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
    for (int n = 0; n < batch * c; n++)
        for (int i = 0; i < oh; i++)
            for (int j = 0; j < ow; j++) {
                float m = -INFINITY;
                for (int u = 0; u < kh; u++)
                    for (int v = 0; v < kw; v++) {
                        int r = i * stride - pad + u, s = j * stride - pad + v;
                        if (r < 0 || r >= h || s < 0 || s >= w) continue;
                        float t = x[((int64_t)n * h + r) * w + s];
                        if (t != t || t > m) m = t;
                        if (m != m) break;
                    }
                y[((int64_t)n * oh + i) * ow + j] = m;
            }
    return 0;
}

/* Batched y[b] = x[b] @ w[b] (w [batch, k, n]: "nn"), dense batches. */
int toy_bmm(const float *x, const float *w, float *y, int64_t batch, int64_t m, int64_t n,
            int64_t k) {
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                float acc = 0.0f;
                for (int64_t p = 0; p < k; p++)
                    acc += x[(b * m + i) * k + p] * w[(b * k + p) * n + j];
                y[(b * m + i) * n + j] = acc;
            }
    return 0;
}

/* y = hardswish(x @ w.T + b): v * min(max(v + 3, 0), 6) / 6. */
int toy_dense_bias_hardswish(const float *x, const float *w, const float *b, float *y,
                             int64_t m, int64_t n, int64_t k) {
    dense(x, w, b, y, m, n, k, 0);
    for (int64_t i = 0; i < m * n; i++) {
        const float t = y[i] + 3.0f;
        y[i] = y[i] * (t < 0.0f ? 0.0f : t > 6.0f ? 6.0f : t) / 6.0f;
    }
    return 0;
}

/* y = gelu(x @ w.T + b), the erf form. */
int toy_dense_bias_gelu(const float *x, const float *w, const float *b, float *y,
                        int64_t m, int64_t n, int64_t k) {
    dense(x, w, b, y, m, n, k, 0);
    for (int64_t i = 0; i < m * n; i++)
        y[i] = 0.5f * y[i] * (1.0f + erff(y[i] * 0.70710678118654752f));
    return 0;
}
