/* A template (see template.h) of direct_conv.c: the weight-gradient block dw_<RC>x<NV> of one task over rows
 * [r0, r1) and positions [o0, o1): RC output channels from c0 x 16 * NV input channels from cb of tap offset xo,
 * added into out (row stride Cg). */

#define NAME XCONV_CAT(XCONV_CAT(XCONV_CAT(dw_, RC), x), NV)
static inline void NAME(const float *dy, int64_t ldy, const float *x, int64_t ldx, int64_t step, int64_t xo, const
                        int64_t *rdy, const int64_t *rx, int64_t r0, int64_t r1, int64_t o0, int64_t o1, int64_t c0,
                        int64_t cb, float *out, int64_t Cg) {
    v16 acc[RC][NV];
    for (int c = 0; c < RC; c++)
        for (int v = 0; v < NV; v++) acc[c][v] = load16(out + c * Cg + 16 * v);
    for (int64_t r = r0; r < r1; r++) {
        const float *d = dy + rdy[r] + c0 * ldy;
        const float *xr = x + (rx[r] + xo) * ldx + cb;
        #pragma GCC unroll 2
        for (int64_t o = o0; o < o1; o++) {
            v16 xv[NV];
            for (int v = 0; v < NV; v++) xv[v] = load16(xr + o * step + 16 * v);
            #pragma GCC unroll 16
            for (int c = 0; c < RC; c++) {
                float b = d[c * ldy + o];
                for (int v = 0; v < NV; v++) acc[c][v] += b * xv[v];
            }
        }
    }
    for (int c = 0; c < RC; c++)
        for (int v = 0; v < NV; v++) store16(out + c * Cg + 16 * v, acc[c][v]);
}

#undef NAME
#undef RC
#undef NV
