int toy_dense_bias(const float *x, const float *w, const float *b, float *y, int64_t m,
                   int64_t n, int64_t k);
int toy_dense_bias_relu(const float *x, const float *w, const float *b, float *y, int64_t m,
                        int64_t n, int64_t k);
int toy_conv2d_bias_relu(const float *x, const float *w, const float *b, float *y,
                         int batch, int c, int h, int wd, int oc, int kh, int kw, int pad);
int toy_dense_fails(const float *x, const float *w, const float *b, float *y, int64_t m,
                    int64_t n, int64_t k);
void toy_dense_bias_void(const float *x, const float *w, const float *b, float *y, long m,
                         long n, long k);
int toy_softmax(const float *x, float *y, int64_t rows, int64_t cols);
int toy_avg_pool2d(const float *x, float *y, int batch, int c, int h, int w, int kh, int kw,
                   int stride, int pad);
int toy_max_pool2d(const float *x, float *y, int batch, int c, int h, int w, int kh, int kw,
                   int stride, int pad);
int toy_bmm(const float *x, const float *w, float *y, int64_t batch, int64_t m, int64_t n,
            int64_t k);
int toy_dense_bias_gelu(const float *x, const float *w, const float *b, float *y,
                        int64_t m, int64_t n, int64_t k);
int toy_dense_bias_hardswish(const float *x, const float *w, const float *b, float *y,
                             int64_t m, int64_t n, int64_t k);
