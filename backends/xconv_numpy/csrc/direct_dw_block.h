/* A template (see template.h) of direct_conv.c: the weight-gradient block dw_<RC>x<NV> of one task over rows
 * [r0, r1) and positions [o0, o1): RC output channels from c0 x VW * NV input channels from cb of tap offset xo,
 * added into out (row stride Cg); only the rows r with ok[(r % R) * K] set (the others read x's padding). */

#ifndef VW                 /* the vector: 16 floats (v16) unless the instantiation names another (VT, VW, LOADV) */
#define VT v16
#define VW 16
#define LOADV load16
#define PRE dw_
#endif
#define NAME XCONV_CAT(XCONV_CAT(XCONV_CAT(PRE, RC), x), NV)
static inline void NAME(const float *dy, int64_t ldy, const float *x, int64_t ldx, int64_t step, int64_t xo, const
                        int64_t *rdy, const int64_t *rx, const uint8_t *ok, int64_t K, int64_t R, int64_t r0,
                        int64_t r1, int64_t o0, int64_t o1, int64_t c0, int64_t cb, float *out, int64_t Cg) {
    VT acc[RC][NV];
    for (int c = 0; c < RC; c++)
        for (int v = 0; v < NV; v++) acc[c][v] = LOADV(out + c * Cg + VW * v);
    for (int64_t r = r0; r < r1; r++) {
        if (!ok[r % R * K])
            continue;
        const float *d = dy + rdy[r] + c0 * ldy;
        const float *xr = x + (rx[r] + xo) * ldx + cb;
        #pragma GCC unroll 2
        for (int64_t o = o0; o < o1; o++) {
            VT xv[NV];
            for (int v = 0; v < NV; v++) xv[v] = LOADV(xr + o * step + VW * v);
            #pragma GCC unroll 16
            for (int c = 0; c < RC; c++) {
                float b = d[c * ldy + o];
                for (int v = 0; v < NV; v++) acc[c][v] += b * xv[v];
            }
        }
    }
    for (int c = 0; c < RC; c++)
        for (int v = 0; v < NV; v++) memcpy(out + c * Cg + VW * v, &acc[c][v], sizeof acc[c][v]);
}

#undef NAME
#undef RC
#undef NV
#undef VT
#undef VW
#undef LOADV
#undef PRE
