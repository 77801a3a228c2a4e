/* One block of csrc/stem.c's weight gradient: WKT output channels x WKC taps of a tap row (a template, template.h:
 * instantiated with WKT, WKC, WTAIL and the function's name WNAME; array sizes are constants, so the accumulators
 * stay in registers). WTAIL 0: OW a multiple of STEM_L; 1: any OW >= STEM_L, the last OW % STEM_L positions as the
 * row's last STEM_L with those before masked out (the code for it costs the loop registers: a separate instantiation).
 * The template undefines its parameters at its end. */

static __attribute__((unused)) void WNAME(const float *ph, const float *dy, float *dw, const int64_t *g, int64_t Co, int64_t k0, int64_t t,
                  int64_t kw0, const int64_t *kwo, int64_t lq) {
    const int64_t N = g[S_N], C = g[S_C], D = g[S_D], H = g[S_H], OD = g[S_OD], OH = g[S_OH], OW = g[S_OW];
    const int64_t KD = g[S_KD], KH = g[S_KH], KW = g[S_KW], sd = g[S_SD], sh = g[S_SH], dd = g[S_DD];
    const int64_t dh = g[S_DH], pd = g[S_PD], phh = g[S_PH], sw = g[S_SW];
    const int64_t c = t / (KD * KH), kd = t / KH % KD, kh = t % KH, plane = OD * OH * OW;
    stem_vec acc[WKT][WKC];
#if WTAIL
    const int64_t tail = OW % STEM_L, at = OW - STEM_L;    /* OW >= STEM_L (the caller's) */
    stem_vec mask = {0};
    for (int l = STEM_L - (int)tail; l < STEM_L; l++) mask[l] = 1.0f;
#endif
    for (int kt = 0; kt < WKT; kt++)
        for (int j = 0; j < WKC; j++) acc[kt][j] = (stem_vec){0};
    for (int64_t n = 0; n < N; n++)
        for (int64_t od = 0; od < OD; od++) {
            const int64_t id = od * sd - pd + kd * dd;
            if (id < 0 || id >= D) continue;
            for (int64_t oh = 0; oh < OH; oh++) {
                const int64_t ih = oh * sh - phh + kh * dh;
                if (ih < 0 || ih >= H) continue;
                const float *xr = ph + (((n * C + c) * D + id) * H + ih) * sw * lq;
                const float *dr = dy + (n * Co + k0) * plane + (od * OH + oh) * OW;
                for (int64_t ow0 = 0; ow0 + STEM_L <= OW; ow0 += STEM_L) {
#if WKT * WKC + WKC + 1 <= STEM_REGS
                    /* the row's WKC tap vectors and one dy vector held in registers: WKT + WKC loads per WKT x WKC
                     * multiply-adds (left to itself GCC folded a dy load into every multiply-add: the loop was bound
                     * by its loads; 3-tap blocks ran 20-25% faster) */
                    stem_vec xv[WKC];
                    for (int j = 0; j < WKC; j++) {
                        xv[j] = stem_load(xr + kwo[kw0 + j] + ow0);
                        STEM_IN_REGISTER(xv[j]);
                    }
                    for (int kt = 0; kt < WKT; kt++) {
                        stem_vec dv = stem_load(dr + kt * plane + ow0);
                        STEM_IN_REGISTER(dv);
                        for (int j = 0; j < WKC; j++) acc[kt][j] += dv * xv[j];
                    }
#else
                    stem_vec dv[WKT];
                    for (int kt = 0; kt < WKT; kt++) dv[kt] = stem_load(dr + kt * plane + ow0);
                    for (int j = 0; j < WKC; j++) {
                        const stem_vec xv = stem_load(xr + kwo[kw0 + j] + ow0);
                        for (int kt = 0; kt < WKT; kt++) acc[kt][j] += dv[kt] * xv;
                    }
#endif
                }
#if WTAIL
                if (tail) {         /* the last OW % STEM_L positions: the row's last STEM_L, those before masked out (one
                                     * dy vector at a time: the registers are the accumulators') */
                    for (int kt = 0; kt < WKT; kt++) {
                        const stem_vec dv = stem_load(dr + kt * plane + at) * mask;
                        for (int j = 0; j < WKC; j++) acc[kt][j] += dv * stem_load(xr + kwo[kw0 + j] + at);
                    }
                }
#endif
            }
        }
    for (int kt = 0; kt < WKT; kt++)
        for (int j = 0; j < WKC; j++) dw[(k0 + kt) * C * KD * KH * KW + t * KW + kw0 + j] = stem_lane_sum(acc[kt][j]);
}

#undef WKT
#undef WKC
#undef WTAIL
#undef WNAME
