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
