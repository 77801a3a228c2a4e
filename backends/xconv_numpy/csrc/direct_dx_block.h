/* A template (see template.h) of direct_conv.c: the input-gradient block dx_<NR>x<NV>, NR positions j.. of a row
 * and VW * NV input channels from cb (VW floats per vector: 16, or 8 in the AVX2 build's blocks):
 *   dx[rout + (cb + ci) * ldx + (j + k) * os] = sum_t sum_co dy[rin + co * ldy + j + k - off[t]] * w[(t * Cog + co) * ldw + cb + ci]
 * taps in order, channels in order within a tap (os: the output's position step, the stride on a phase). */

#ifndef VW                 /* the vector: 16 floats (v16) unless the instantiation names another (VT, VW, LOADV) */
#define VT v16
#define VW 16
#define LOADV load16
#define PRE dx_
#endif
#define NAME XCONV_CAT(XCONV_CAT(XCONV_CAT(PRE, NR), x), NV)
static inline void NAME(const float *dyr, int64_t ldy, const float *w, int64_t ldw, const int64_t *off, int64_t T,
                        int64_t Cog, float *dxr, int64_t ldx, int64_t os, int64_t j, int64_t cb) {
    VT acc[NR][NV];
    for (int k = 0; k < NR; k++)
        for (int v = 0; v < NV; v++) acc[k][v] = (VT){0};
    for (int64_t t = 0; t < T; t++) {
        const float *d = dyr + j - off[t];
        const float *wt = w + t * Cog * ldw + cb;
        #pragma GCC unroll 2
        for (int64_t co = 0; co < Cog; co++) {
            VT wv[NV];
            for (int v = 0; v < NV; v++) wv[v] = LOADV(wt + co * ldw + VW * v);
            const float *dc = d + co * ldy;
            #pragma GCC unroll 14
            for (int k = 0; k < NR; k++) {
                float b = dc[k];
                for (int v = 0; v < NV; v++) acc[k][v] += b * wv[v];
            }
        }
    }
#if VW == 16
    if (TILE_STORES && NR <= 16 && os == 1) {  /* a channel's positions contiguous: transpose, store */
        for (int v = 0; v < NV; v++) {
            v16 t[16];
            for (int k = 0; k < 16; k++) t[k] = k < NR ? acc[k][v] : (v16){0};
            transpose16(t);
            for (int c = 0; c < 16; c++)
                memcpy(dxr + (cb + 16 * v + c) * ldx + j, &t[c], NR * sizeof(float));
        }
        return;
    }
#endif
    float buf[NR][VW * NV];
    for (int k = 0; k < NR; k++)
        for (int v = 0; v < NV; v++) memcpy(&buf[k][VW * v], &acc[k][v], sizeof acc[k][v]);
    for (int c = 0; c < VW * NV; c++)
        for (int k = 0; k < NR; k++) dxr[(cb + c) * ldx + (j + k) * os] = buf[k][c];
}

#undef NAME
#undef NR
#undef NV
#undef VT
#undef VW
#undef LOADV
#undef PRE
