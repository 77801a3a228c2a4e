/* The argument vectors Python passes to the compiled loops, declared once: per vector, its slots in order as
 * X(NAME, width). Each list makes an enum (NAME the slot's first index, <PREFIX>LEN the vector's length) and a
 * string "NAME:width ..." that xconv_layout_slots() reports; backends/xconv_numpy/layout.py holds the same lists
 * and refuses, at load, a library whose version or lists differ. Change a list here and there together, and bump
 * XCONV_LAYOUT_VERSION. */
#ifndef XCONV_LAYOUT_H
#define XCONV_LAYOUT_H

#include "template.h"

#define XCONV_LAYOUT_VERSION 2

/* depthwise.c's geo: C, m, H, W, OH, OW, Lh, Lw, K, nRw, nslots, need_dx, need_dw, need_db, x strides (n, c, h, w),
 * dy strides (n, co, h, w) (strides in elements), the width stride, whether the weights are finite (flat dx), the
 * largest tap offset F */
#define XCONV_DEPTHWISE_GEO(X)                                                                                  \
    X(G_C, 1) X(G_M, 1) X(G_H, 1) X(G_W, 1) X(G_OH, 1) X(G_OW, 1) X(G_LH, 1) X(G_LW, 1) X(G_K, 1) X(G_NRW, 1)    \
    X(G_NSLOTS, 1) X(G_DX, 1) X(G_DW, 1) X(G_DB, 1) X(G_XS, 4) X(G_DYS, 4) X(G_SW, 1) X(G_FLATDX, 1) X(G_F, 1)

/* small_cols.c's geo: N, C, D, H, W, OD, OH, OW, KD, KH, KW, strides (d, h, w), dilations (d, h, w), padding
 * before (d, h, w), x's element strides (n, c, d, h, w) */
#define XCONV_SMALL_COLS_GEO(X)                                                                                 \
    X(S_N, 1) X(S_C, 1) X(S_D, 1) X(S_H, 1) X(S_W, 1) X(S_OD, 1) X(S_OH, 1) X(S_OW, 1) X(S_KD, 1) X(S_KH, 1)     \
    X(S_KW, 1) X(S_SD, 1) X(S_SH, 1) X(S_SW, 1) X(S_DD, 1) X(S_DH, 1) X(S_DW, 1) X(S_PD, 1) X(S_PH, 1)          \
    X(S_PW, 1) X(S_XS, 5)

/* small_grid.c's plan of a stride-1 call: sizes, the x grid (dims, at, size, rows), the dy grid (the same), the dy
 * grid's base, dy's kept extents, the input's and output's spatial dims, whether dW reads dy from dy's grid (and
 * from which corner), the planes y and dx have on the grids' rows; then (P_OFF on, not counted in the length)
 * the x taps' offsets and the dy taps', K each */
#define XCONV_SMALL_S1_PLAN(X)                                                                                  \
    X(P_N, 1) X(P_C, 1) X(P_CO, 1) X(P_G, 1) X(P_CIG, 1) X(P_COG, 1) X(P_K, 1) X(P_XG, 8) X(P_DG, 8)            \
    X(P_DBASE, 1) X(P_KEEP, 3) X(P_S, 3) X(P_O, 3) X(P_DZ, 1) X(P_CORNER, 1) X(P_YCROP, 3) X(P_XCROP, 3)     \
    X(P_OFF, 0)

/* small_grid.c's element strides of x and of dy: n, c, d, h, w */
#define XCONV_SMALL_S1_STRIDES(X) X(E_N, 1) X(E_C, 1) X(E_D, 1) X(E_H, 1) X(E_W, 1)

/* bias_sum.c's geo: N, C, spatial dims (d, h, w), grad_y's element strides (n, c, d, h, w) */
#define XCONV_BIAS_GEO(X) X(B_N, 1) X(B_C, 1) X(B_D, 1) X(B_H, 1) X(B_W, 1) X(B_S, 5)

#define XCONV_SLOT_ENUM(name, width) name, XCONV_CAT(name, _END_) = name + (width) - 1,
#define XCONV_SLOT_TEXT(name, width) #name ":" #width " "

enum { XCONV_DEPTHWISE_GEO(XCONV_SLOT_ENUM) G_LEN };
enum { XCONV_SMALL_COLS_GEO(XCONV_SLOT_ENUM) S_LEN };
enum { XCONV_SMALL_S1_PLAN(XCONV_SLOT_ENUM) P_LEN };
enum { XCONV_SMALL_S1_STRIDES(XCONV_SLOT_ENUM) E_LEN };
enum { XCONV_BIAS_GEO(XCONV_SLOT_ENUM) B_LEN };

/* Which vector xconv_layout() and xconv_layout_slots() describe (0: xconv_layout() is the layout version). */
enum { XCONV_LAYOUT_DEPTHWISE_GEO = 1, XCONV_LAYOUT_SMALL_COLS_GEO, XCONV_LAYOUT_SMALL_S1_PLAN,
       XCONV_LAYOUT_SMALL_S1_STRIDES, XCONV_LAYOUT_BIAS_GEO };

#endif
