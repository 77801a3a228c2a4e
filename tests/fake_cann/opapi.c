#define _GNU_SOURCE /* usleep */
/* libopapi.so: aclnnConvolutionBackward and aclnnConvolution (two-phase API). */
#include "fake_cann.h"
#include <unistd.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ERR(...) fakecann_priv_error(__VA_ARGS__)
#define EXEC_MAGIC 0x45584543u

#define FAIL(code, ...)      \
    do {                     \
        ERR(__VA_ARGS__);    \
        return (code);       \
    } while (0)
#define TRY(expr)              \
    do {                       \
        int rc_ = (expr);      \
        if (rc_) return rc_;   \
    } while (0)

static const char *const FN_BWD = "aclnnConvolutionBackwardGetWorkspaceSize";
static const char *const FN_FWD = "aclnnConvolutionGetWorkspaceSize";

enum { FAM_OTHER = 0, FAM_A2 = 1, FAM_OLD = 2 };
enum { PREC_EXACT = 0, PREC_FP16 = 1, PREC_HF32 = 2 };

#define MAX_VAL ((int64_t)1 << 31)

/* ------------------------------------------------------------------ misc */
static int soc_family(const char *soc)
{
    if (!soc) return FAM_OTHER;
    if (strncmp(soc, "Ascend910B", 10) == 0 || strncmp(soc, "Ascend910_93", 12) == 0) return FAM_A2;
    if (strncmp(soc, "Ascend910", 9) == 0 || strncmp(soc, "Ascend310P", 10) == 0) return FAM_OLD;
    return FAM_OTHER;
}

static int itemsize(int dtype)
{
    switch (dtype) {
    case ACL_FLOAT: return 4;
    case ACL_FLOAT16: return 2;
    case ACL_BF16: return 2;
    default: return 0;
    }
}

static const char *dtype_name(int dtype)
{
    switch (dtype) {
    case ACL_FLOAT: return "FLOAT";
    case ACL_FLOAT16: return "FLOAT16";
    case ACL_BF16: return "BFLOAT16";
    default: return "unsupported";
    }
}

static const char *format_name(int f)
{
    switch (f) {
    case ACL_FORMAT_NCHW: return "NCHW";
    case ACL_FORMAT_NHWC: return "NHWC";
    case ACL_FORMAT_ND: return "ND";
    case ACL_FORMAT_NCDHW: return "NCDHW";
    case ACL_FORMAT_NDHWC: return "NDHWC";
    case ACL_FORMAT_NCL: return "NCL";
    default: return "other";
    }
}

static int64_t numel(const aclTensor *t)
{
    int64_t n = 1;
    for (uint64_t i = 0; i < t->ndim; i++) n *= t->dims[i];
    return n;
}

static int64_t storage_numel(const aclTensor *t)
{
    int64_t n = 1;
    for (uint64_t i = 0; i < t->sndim; i++) n *= t->sdims[i];
    return n;
}

static void shape_str(const aclTensor *t, char *buf, size_t cap)
{
    size_t len = 0;
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (uint64_t i = 0; i < t->ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

static int is_contiguous(const aclTensor *t)
{
    int64_t expect = 1;
    for (uint64_t i = t->ndim; i > 0; i--) {
        if (t->dims[i - 1] != 1 && t->strides[i - 1] != expect) return 0;
        expect *= t->dims[i - 1];
    }
    return 1;
}

/* ----------------------------------------------------- float conversions */
/* round |x| to a binary format with `mbits` stored mantissa bits, minimum
 * normal exponent emin and maximum exponent emax; round-to-nearest-even. */
static double round_format(double x, int mbits, int emin, int emax)
{
    if (isnan(x) || isinf(x) || x == 0.0) return x;
    double a = fabs(x);
    int E;
    frexp(a, &E);
    int e = E - 1;
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - mbits);
    double r = nearbyint(a / q) * q;
    if (r >= ldexp(1.0, emax + 1)) r = INFINITY;
    return copysign(r, x);
}

static uint16_t encode_small(double x, int mbits, int emin, int emax, int bias, uint16_t nan_bits)
{
    if (isnan(x)) return nan_bits;
    double r = round_format(x, mbits, emin, emax);
    uint16_t sign = signbit(r) ? 0x8000 : 0;
    double a = fabs(r);
    uint16_t expmask = (uint16_t)(((1u << (15 - mbits)) - 1u) << mbits);
    if (isinf(a)) return sign | expmask;
    if (a == 0.0) return sign;
    if (a < ldexp(1.0, emin)) return sign | (uint16_t)ldexp(a, mbits - emin);
    int E;
    frexp(a, &E);
    int e = E - 1;
    uint16_t m = (uint16_t)(ldexp(a, mbits - e) - ldexp(1.0, mbits));
    return sign | (uint16_t)((unsigned)(e + bias) << mbits) | m;
}

static double half_to_double(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0)
        v = ldexp((double)m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp((double)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

static double bf16_to_double(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return (double)f;
}

static double read_elem(const char *base, int64_t off, int dtype)
{
    switch (dtype) {
    case ACL_FLOAT: {
        float f;
        memcpy(&f, base + off * 4, 4);
        return (double)f;
    }
    case ACL_FLOAT16: {
        uint16_t h;
        memcpy(&h, base + off * 2, 2);
        return half_to_double(h);
    }
    default: {
        uint16_t h;
        memcpy(&h, base + off * 2, 2);
        return bf16_to_double(h);
    }
    }
}

static void write_elem(char *base, int64_t off, int dtype, double v)
{
    switch (dtype) {
    case ACL_FLOAT: {
        float f = (float)v;
        memcpy(base + off * 4, &f, 4);
        break;
    }
    case ACL_FLOAT16: {
        uint16_t h = encode_small(v, 10, -14, 15, 15, 0x7e00);
        memcpy(base + off * 2, &h, 2);
        break;
    }
    default: {
        uint16_t h = encode_small(v, 7, -126, 127, 127, 0x7fc0);
        memcpy(base + off * 2, &h, 2);
        break;
    }
    }
}

static double apply_prec(double v, int prec)
{
    switch (prec) {
    case PREC_FP16: return round_format(v, 10, -14, 15);
    case PREC_HF32: return round_format(v, 11, -126, 127);
    default: return v;
    }
}

/* load a (strided) tensor into a contiguous double array */
static double *load_tensor(const aclTensor *t, int prec)
{
    int64_t n = numel(t);
    double *out = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!out) return NULL;
    int64_t idx[FC_MAX_DIMS] = {0};
    int64_t off = t->offset;
    int nd = (int)t->ndim;
    for (int64_t i = 0; i < n; i++) {
        out[i] = apply_prec(read_elem((const char *)t->data, off, t->dtype), prec);
        for (int d = nd - 1; d >= 0; d--) {
            idx[d]++;
            off += t->strides[d];
            if (idx[d] < t->dims[d]) break;
            off -= t->strides[d] * t->dims[d];
            idx[d] = 0;
        }
    }
    return out;
}

static void store_tensor(const aclTensor *t, const double *src)
{
    int64_t n = numel(t);
    int64_t idx[FC_MAX_DIMS] = {0};
    int64_t off = t->offset;
    int nd = (int)t->ndim;
    for (int64_t i = 0; i < n; i++) {
        write_elem((char *)t->data, off, t->dtype, src[i]);
        for (int d = nd - 1; d >= 0; d--) {
            idx[d]++;
            off += t->strides[d];
            if (idx[d] < t->dims[d]) break;
            off -= t->strides[d] * t->dims[d];
            idx[d] = 0;
        }
    }
}

/* ------------------------------------------------------------- geometry */
typedef struct {
    int nsp;
    int transposed;
    int64_t N, G, Cin, Cout; /* forward sense: x has Cin channels, y has Cout */
    int64_t xs[3], ys[3], k[3], st[3], pre[3], post[3], dil[3], opad[3];
} conv_geom;

/* normalized 3-D problem: A-space tensor (N, CA, A...), B-space tensor
 * (N, CB, B...), weight (CB, CA/G, K...); a_pos = b_pos*s - p + k*d */
typedef struct {
    int64_t N, G, CA, CB;
    int64_t A[3], B[3], K[3], s[3], p[3], d[3];
} cgeom;

static cgeom to_cgeom(const conv_geom *g)
{
    cgeom c;
    c.N = g->N;
    c.G = g->G;
    c.CA = g->transposed ? g->Cout : g->Cin;
    c.CB = g->transposed ? g->Cin : g->Cout;
    for (int i = 0; i < 3; i++) {
        c.A[i] = c.B[i] = c.K[i] = c.s[i] = c.d[i] = 1;
        c.p[i] = 0;
    }
    for (int j = 0; j < g->nsp; j++) {
        int slot = 3 - g->nsp + j;
        c.A[slot] = g->transposed ? g->ys[j] : g->xs[j];
        c.B[slot] = g->transposed ? g->xs[j] : g->ys[j];
        c.K[slot] = g->k[j];
        c.s[slot] = g->st[j];
        c.p[slot] = g->pre[j];
        c.d[slot] = g->dil[j];
    }
    return c;
}

#define SP(c, X) ((c)->X[0] * (c)->X[1] * (c)->X[2])

/* B = correlation of A with W */
static void k_corr(const cgeom *c, const double *A, const double *W, double *B)
{
    int64_t CAg = c->CA / c->G, CBg = c->CB / c->G;
    int64_t Asz = SP(c, A), Bsz = SP(c, B), Ksz = SP(c, K);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t cb = 0; cb < c->CB; cb++) {
            int64_t gi = cb / CBg;
            double *Bp = B + (n * c->CB + cb) * Bsz;
            for (int64_t b0 = 0; b0 < c->B[0]; b0++)
                for (int64_t b1 = 0; b1 < c->B[1]; b1++)
                    for (int64_t b2 = 0; b2 < c->B[2]; b2++) {
                        double acc = 0.0;
                        for (int64_t cal = 0; cal < CAg; cal++) {
                            const double *Ap = A + (n * c->CA + gi * CAg + cal) * Asz;
                            const double *Wp = W + (cb * CAg + cal) * Ksz;
                            for (int64_t k0 = 0; k0 < c->K[0]; k0++) {
                                int64_t i0 = b0 * c->s[0] - c->p[0] + k0 * c->d[0];
                                if (i0 < 0 || i0 >= c->A[0]) continue;
                                for (int64_t k1 = 0; k1 < c->K[1]; k1++) {
                                    int64_t i1 = b1 * c->s[1] - c->p[1] + k1 * c->d[1];
                                    if (i1 < 0 || i1 >= c->A[1]) continue;
                                    for (int64_t k2 = 0; k2 < c->K[2]; k2++) {
                                        int64_t i2 = b2 * c->s[2] - c->p[2] + k2 * c->d[2];
                                        if (i2 < 0 || i2 >= c->A[2]) continue;
                                        acc += Ap[(i0 * c->A[1] + i1) * c->A[2] + i2] *
                                               Wp[(k0 * c->K[1] + k1) * c->K[2] + k2];
                                    }
                                }
                            }
                        }
                        Bp[(b0 * c->B[1] + b1) * c->B[2] + b2] = acc;
                    }
        }
}

/* A = scatter of B through W (adjoint of k_corr w.r.t. A) */
static void k_scatter(const cgeom *c, const double *B, const double *W, double *A)
{
    int64_t CAg = c->CA / c->G, CBg = c->CB / c->G;
    int64_t Asz = SP(c, A), Bsz = SP(c, B), Ksz = SP(c, K);
    memset(A, 0, (size_t)(c->N * c->CA * Asz) * sizeof(double));
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t cb = 0; cb < c->CB; cb++) {
            int64_t gi = cb / CBg;
            const double *Bp = B + (n * c->CB + cb) * Bsz;
            for (int64_t cal = 0; cal < CAg; cal++) {
                double *Ap = A + (n * c->CA + gi * CAg + cal) * Asz;
                const double *Wp = W + (cb * CAg + cal) * Ksz;
                for (int64_t b0 = 0; b0 < c->B[0]; b0++)
                    for (int64_t b1 = 0; b1 < c->B[1]; b1++)
                        for (int64_t b2 = 0; b2 < c->B[2]; b2++) {
                            double bv = Bp[(b0 * c->B[1] + b1) * c->B[2] + b2];
                            for (int64_t k0 = 0; k0 < c->K[0]; k0++) {
                                int64_t i0 = b0 * c->s[0] - c->p[0] + k0 * c->d[0];
                                if (i0 < 0 || i0 >= c->A[0]) continue;
                                for (int64_t k1 = 0; k1 < c->K[1]; k1++) {
                                    int64_t i1 = b1 * c->s[1] - c->p[1] + k1 * c->d[1];
                                    if (i1 < 0 || i1 >= c->A[1]) continue;
                                    for (int64_t k2 = 0; k2 < c->K[2]; k2++) {
                                        int64_t i2 = b2 * c->s[2] - c->p[2] + k2 * c->d[2];
                                        if (i2 < 0 || i2 >= c->A[2]) continue;
                                        Ap[(i0 * c->A[1] + i1) * c->A[2] + i2] +=
                                            bv * Wp[(k0 * c->K[1] + k1) * c->K[2] + k2];
                                    }
                                }
                            }
                        }
            }
        }
}

/* W = sum over n, b of B * A (gradient of k_corr w.r.t. W) */
static void k_wgrad(const cgeom *c, const double *A, const double *B, double *W)
{
    int64_t CAg = c->CA / c->G, CBg = c->CB / c->G;
    int64_t Asz = SP(c, A), Bsz = SP(c, B), Ksz = SP(c, K);
    for (int64_t cb = 0; cb < c->CB; cb++) {
        int64_t gi = cb / CBg;
        for (int64_t cal = 0; cal < CAg; cal++)
            for (int64_t k0 = 0; k0 < c->K[0]; k0++)
                for (int64_t k1 = 0; k1 < c->K[1]; k1++)
                    for (int64_t k2 = 0; k2 < c->K[2]; k2++) {
                        double acc = 0.0;
                        for (int64_t n = 0; n < c->N; n++) {
                            const double *Ap = A + (n * c->CA + gi * CAg + cal) * Asz;
                            const double *Bp = B + (n * c->CB + cb) * Bsz;
                            for (int64_t b0 = 0; b0 < c->B[0]; b0++) {
                                int64_t i0 = b0 * c->s[0] - c->p[0] + k0 * c->d[0];
                                if (i0 < 0 || i0 >= c->A[0]) continue;
                                for (int64_t b1 = 0; b1 < c->B[1]; b1++) {
                                    int64_t i1 = b1 * c->s[1] - c->p[1] + k1 * c->d[1];
                                    if (i1 < 0 || i1 >= c->A[1]) continue;
                                    for (int64_t b2 = 0; b2 < c->B[2]; b2++) {
                                        int64_t i2 = b2 * c->s[2] - c->p[2] + k2 * c->d[2];
                                        if (i2 < 0 || i2 >= c->A[2]) continue;
                                        acc += Bp[(b0 * c->B[1] + b1) * c->B[2] + b2] *
                                               Ap[(i0 * c->A[1] + i1) * c->A[2] + i2];
                                    }
                                }
                            }
                        }
                        W[(cb * CAg + cal) * Ksz + (k0 * c->K[1] + k1) * c->K[2] + k2] = acc;
                    }
    }
}

/* ------------------------------------------------------------ validation */
static int check_live(const char *fn, const char *name, const aclTensor *t)
{
    if (!fakecann_priv_is_live(FAKECANN_KIND_TENSOR, t))
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s (%p) is not a live aclTensor", fn, name, (const void *)t);
    return 0;
}

static int check_array_live(const char *fn, const char *name, const void *a, int kind)
{
    if (!fakecann_priv_is_live(kind, a))
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s (%p) is not a live %s", fn, name, a,
             kind == FAKECANN_KIND_INT_ARRAY ? "aclIntArray" : "aclBoolArray");
    return 0;
}

static int expected_format(int nsp)
{
    return nsp == 1 ? ACL_FORMAT_NCL : nsp == 2 ? ACL_FORMAT_NCHW : ACL_FORMAT_NCDHW;
}

/* dtype + rank + format of a conv tensor (3-D..5-D) or a bias (1-D, ND) */
static int check_desc(const char *fn, const char *name, const aclTensor *t, int dtype, uint64_t ndim)
{
    if (t->dtype != ACL_FLOAT && t->dtype != ACL_FLOAT16 && t->dtype != ACL_BF16)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s dtype %d is not supported (FLOAT, FLOAT16, BFLOAT16)", fn,
             name, t->dtype);
    if (t->dtype != dtype)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s dtype %s does not match %s", fn, name, dtype_name(t->dtype),
             dtype_name(dtype));
    if (t->ndim != ndim)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s must be %llu-D, got %llu-D", fn, name,
             (unsigned long long)ndim, (unsigned long long)t->ndim);
    int want = ndim == 1 ? ACL_FORMAT_ND : expected_format((int)ndim - 2);
    if (t->format != want)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s format %s(%d) is not supported, expected %s(%d)", fn, name,
             format_name(t->format), t->format, format_name(want), want);
    return 0;
}

static int check_dims(const char *fn, const char *name, const aclTensor *t, const int64_t *want)
{
    for (uint64_t i = 0; i < t->ndim; i++) {
        if (t->dims[i] != want[i]) {
            char got[160], exp[160];
            shape_str(t, got, sizeof got);
            aclTensor tmp = *t;
            memcpy(tmp.dims, want, t->ndim * sizeof(int64_t));
            shape_str(&tmp, exp, sizeof exp);
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s shape %s does not match the expected shape %s", fn, name,
                 got, exp);
        }
    }
    return 0;
}

/* all accessed elements inside the storage, storage inside device memory */
static int check_storage(const char *fn, const char *name, const aclTensor *t)
{
    int64_t n = numel(t);
    if (n == 0) return 0;
    int64_t maxoff = t->offset;
    for (uint64_t i = 0; i < t->ndim; i++) {
        if (t->strides[i] < 0)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: %s stride[%llu] = %lld is negative", fn, name,
                 (unsigned long long)i, (long long)t->strides[i]);
        maxoff += (t->dims[i] - 1) * t->strides[i];
    }
    int64_t sn = storage_numel(t);
    if (maxoff >= sn)
        FAIL(ACLNN_ERR_PARAM_INVALID,
             "%s: %s view (offset %lld, strides) reaches element %lld outside its storage of %lld elements",
             fn, name, (long long)t->offset, (long long)maxoff, (long long)sn);
    if (!t->data) FAIL(ACLNN_ERR_PARAM_NULLPTR, "%s: %s has a NULL data pointer", fn, name);
    if (fakecann_priv_config()->check_device_ptr &&
        !fakecann_priv_in_device_mem(t->data, (uint64_t)sn * (uint64_t)itemsize(t->dtype)))
        FAIL(ACLNN_ERR_PARAM_INVALID,
             "%s: %s storage (%p, %lld bytes) is not inside live device memory from aclrtMalloc", fn, name,
             t->data, (long long)(sn * itemsize(t->dtype)));
    return 0;
}

static int check_out_contig(const char *fn, const char *name, const aclTensor *t)
{
    if (fakecann_priv_config()->strict_outputs && !is_contiguous(t))
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: output %s must be contiguous", fn, name);
    return 0;
}

/* validates input/weight/params shared by both ops, fills g (incl. ys) */
static int validate_conv(const char *fn, const aclTensor *x, const aclTensor *w, const aclIntArray *stride,
                         const aclIntArray *padding, const aclIntArray *dilation, bool transposed,
                         const aclIntArray *outputPadding, int64_t groups, int8_t cube, int family,
                         const char *soc, conv_geom *g)
{
    memset(g, 0, sizeof *g);
    if (cube < 0 || cube > 3)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: cubeMathType %d is invalid, expected 0..3", fn, (int)cube);
    if (w->ndim < 3 || w->ndim > 5)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: weight must be 3-D, 4-D or 5-D, got %llu-D", fn,
             (unsigned long long)w->ndim);
    int nsp = (int)w->ndim - 2;
    int dtype = x->dtype;
    TRY(check_desc(fn, "input", x, dtype, w->ndim));
    TRY(check_desc(fn, "weight", w, dtype, w->ndim));
    g->nsp = nsp;
    g->transposed = transposed ? 1 : 0;
    g->G = groups;
    g->N = x->dims[0];

    for (uint64_t i = 0; i < w->ndim; i++)
        if (w->dims[i] < 1 || w->dims[i] > MAX_VAL)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: weight dim %llu = %lld must be in [1, 2^31]", fn,
                 (unsigned long long)i, (long long)w->dims[i]);
    if (x->dims[1] < 1 || x->dims[1] > MAX_VAL || x->dims[0] > MAX_VAL)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: input channel dim %lld must be >= 1", fn, (long long)x->dims[1]);
    for (int j = 0; j < nsp; j++) {
        if (x->dims[2 + j] < 1 || x->dims[2 + j] > MAX_VAL)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: input spatial dim %d = %lld must be >= 1", fn, j,
                 (long long)x->dims[2 + j]);
        g->xs[j] = x->dims[2 + j];
        g->k[j] = w->dims[2 + j];
    }

    /* int arrays */
    if (stride->size != (uint64_t)nsp)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: stride must have %d values, got %llu", fn, nsp,
             (unsigned long long)stride->size);
    if (dilation->size != (uint64_t)nsp)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: dilation must have %d values, got %llu", fn, nsp,
             (unsigned long long)dilation->size);
    if (outputPadding->size != (uint64_t)nsp)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: outputPadding must have %d values, got %llu", fn, nsp,
             (unsigned long long)outputPadding->size);
    if (padding->size != (uint64_t)nsp && !(nsp == 2 && padding->size == 4))
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: padding must have %d values%s, got %llu", fn, nsp,
             nsp == 2 ? " (or 4: top, bottom, left, right)" : "", (unsigned long long)padding->size);
    for (uint64_t i = 0; i < padding->size; i++)
        if (padding->values[i] < 0 || padding->values[i] > MAX_VAL)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: padding[%llu] = %lld must be >= 0", fn, (unsigned long long)i,
                 (long long)padding->values[i]);
    for (int j = 0; j < nsp; j++) {
        g->st[j] = stride->values[j];
        g->dil[j] = dilation->values[j];
        g->opad[j] = outputPadding->values[j];
        if (padding->size == 4) {
            g->pre[j] = padding->values[2 * j];
            g->post[j] = padding->values[2 * j + 1];
        } else {
            g->pre[j] = g->post[j] = padding->values[j];
        }
        if (g->st[j] < 1 || g->st[j] > MAX_VAL)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: stride[%d] = %lld must be >= 1", fn, j, (long long)g->st[j]);
        if (g->dil[j] < 1 || g->dil[j] > MAX_VAL)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: dilation[%d] = %lld must be >= 1", fn, j,
                 (long long)g->dil[j]);
        if (!transposed && g->opad[j] != 0)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: outputPadding[%d] = %lld must be 0 when transposed is false",
                 fn, j, (long long)g->opad[j]);
        if (transposed && (g->opad[j] < 0 || (g->opad[j] >= g->st[j] && g->opad[j] >= g->dil[j])))
            FAIL(ACLNN_ERR_PARAM_INVALID,
                 "%s: outputPadding[%d] = %lld must be >= 0 and smaller than stride or dilation", fn, j,
                 (long long)g->opad[j]);
    }

    /* groups and channels */
    if (groups < 1 || groups > 65535)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: groups = %lld must be in [1, 65535]", fn, (long long)groups);
    g->Cin = x->dims[1];
    if (!transposed) {
        if (w->dims[0] % groups != 0)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: groups = %lld does not divide weight out-channels %lld", fn,
                 (long long)groups, (long long)w->dims[0]);
        if (w->dims[1] * groups != x->dims[1])
            FAIL(ACLNN_ERR_PARAM_INVALID,
                 "%s: groups (%lld) * weight C (%lld) must equal input C (%lld)", fn, (long long)groups,
                 (long long)w->dims[1], (long long)x->dims[1]);
        g->Cout = w->dims[0];
    } else {
        if (w->dims[0] != x->dims[1])
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: transposed: weight N (%lld) must equal input C (%lld)", fn,
                 (long long)w->dims[0], (long long)x->dims[1]);
        if (w->dims[0] % groups != 0)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: groups = %lld does not divide input channels %lld", fn,
                 (long long)groups, (long long)w->dims[0]);
        g->Cout = w->dims[1] * groups;
    }

    /* output spatial sizes */
    for (int j = 0; j < nsp; j++) {
        int64_t span = g->dil[j] * (g->k[j] - 1) + 1;
        if (!transposed) {
            int64_t padded = g->xs[j] + g->pre[j] + g->post[j];
            if (padded < span)
                FAIL(ACLNN_ERR_PARAM_INVALID,
                     "%s: padded input size %lld in spatial dim %d is smaller than the dilated kernel %lld "
                     "(check input/padding/dilation/weight)",
                     fn, (long long)padded, j, (long long)span);
            g->ys[j] = (padded - span) / g->st[j] + 1;
        } else {
            g->ys[j] = (g->xs[j] - 1) * g->st[j] - g->pre[j] - g->post[j] + span + g->opad[j];
            if (g->ys[j] < 1)
                FAIL(ACLNN_ERR_PARAM_INVALID,
                     "%s: transposed output size %lld in spatial dim %d is not positive (padding too large)",
                     fn, (long long)g->ys[j], j);
        }
    }

    /* product constraints */
    if (family == FAM_OLD) {
        if (dtype == ACL_BF16)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: BFLOAT16 is not supported on %s", fn, soc);
        if (dtype == ACL_FLOAT && (cube == FC_KEEP_DTYPE || cube == FC_USE_HF32))
            FAIL(ACLNN_ERR_PARAM_INVALID,
                 "%s: FLOAT input with cubeMathType %d is not supported by the cube unit on %s "
                 "(use 1 ALLOW_FP32_DOWN_PRECISION or 2 USE_FP16)",
                 fn, (int)cube, soc);
    } else if (dtype == ACL_BF16 && cube == FC_USE_FP16) {
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: cubeMathType 2 (USE_FP16) does not support BFLOAT16 input", fn);
    }
    return 0;
}

/* Atlas A2/A3 limits of aclnnConvolutionBackward (non-transposed) */
static int check_a2_limits(const char *fn, const conv_geom *g, const aclIntArray *padding, const char *soc)
{
    int nsp = g->nsp;
    int first_hw = nsp == 3 ? 1 : 0; /* H/W dims (L for 1-D) */
    if (g->transposed) {
        for (int j = 0; j < nsp; j++)
            if (g->opad[j] >= g->st[j])
                FAIL(ACLNN_ERR_PARAM_INVALID, "%s: outputPadding[%d] = %lld must be < stride on %s", fn, j,
                     (long long)g->opad[j], soc);
        return 0;
    }
    for (int j = first_hw; j < nsp; j++)
        if (g->k[j] > 255)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: weight kernel size %lld in spatial dim %d exceeds 255 on %s", fn,
                 (long long)g->k[j], j, soc);
    for (uint64_t i = 0; i < padding->size; i++) {
        int j = padding->size == 4 ? (int)(i / 2) : (int)i;
        if (j >= first_hw && padding->values[i] > 255)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: padding[%llu] = %lld exceeds 255 on %s", fn,
                 (unsigned long long)i, (long long)padding->values[i], soc);
    }
    for (int j = 0; j < nsp; j++)
        if (g->dil[j] > 255)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: dilation[%d] = %lld exceeds 255 on %s", fn, j,
                 (long long)g->dil[j], soc);
    if (nsp == 3)
        for (int j = 1; j < 3; j++)
            if (g->st[j] > 63)
                FAIL(ACLNN_ERR_PARAM_INVALID, "%s: 3-D stride[%d] = %lld exceeds 63 on %s", fn, j,
                     (long long)g->st[j], soc);
    return 0;
}

/* What the cube unit computes a FLOAT input in (aclnnConvolution.md / aclnnConvolutionBackward.md,
 * cubeMathType rows): 1 ALLOW_FP32_DOWN_PRECISION is HFLOAT32 on Atlas A2/A3 (and 950, 200I/500 A2)
 * but FLOAT16 on the older Atlas training/inference series; 2 USE_FP16 is FLOAT16; 3 USE_HF32 is
 * HFLOAT32 (unsupported on the older series). */
static int precision_mode(int dtype, int cube, int family)
{
    if (!fakecann_priv_config()->emulate_precision || dtype != ACL_FLOAT) return PREC_EXACT;
    if (family == FAM_OLD) return (cube == 1 || cube == 2) ? PREC_FP16 : PREC_EXACT;
    if (cube == 1 || cube == 3) return PREC_HF32;
    if (cube == 2) return PREC_FP16;
    return PREC_EXACT;
}

/* -------------------------------------------------------------- executor */
enum { T_GO = 0, T_X = 1, T_W = 2, T_GI = 3, T_GW = 4, T_GB = 5 }; /* backward */
enum { F_X = 0, F_W = 1, F_B = 2, F_Y = 3 };                        /* forward */

struct aclOpExecutor {
    uint32_t magic;
    int op;
    const aclTensor *t[6];
    int used[6];
    conv_geom g;
    int mask;
    int cube;
    int64_t deterministic; /* process-level ACL_OPT_DETERMINISTIC, read at phase 1 like aclnn */
    int dtype;
    int prec;
    uint64_t ws;
};

static aclOpExecutor *new_executor(int op)
{
    aclOpExecutor *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->magic = EXEC_MAGIC;
    e->op = op;
    return e;
}

/* ------------------------------------------------------- backward phase 1 */
aclnnStatus aclnnConvolutionBackwardGetWorkspaceSize(
    const aclTensor *gradOutput, const aclTensor *input, const aclTensor *weight,
    const aclIntArray *biasSizes, const aclIntArray *stride, const aclIntArray *padding,
    const aclIntArray *dilation, bool transposed, const aclIntArray *outputPadding, int groups,
    const aclBoolArray *outputMask, int8_t cubeMathType, aclTensor *gradInput, aclTensor *gradWeight,
    aclTensor *gradBias, uint64_t *workspaceSize, aclOpExecutor **executor)
{
    const char *fn = FN_BWD;
    int inj = fakecann_priv_take_injection(fn);
    if (inj) return inj;
    const char *soc = fakecann_get_soc_name();
    int family = soc_family(soc);

    /* null pointers (161001) */
#define NULLCHK(p)                                                                       \
    if (!(p)) FAIL(ACLNN_ERR_PARAM_NULLPTR, "%s: %s must not be nullptr", fn, #p)
    NULLCHK(gradOutput);
    NULLCHK(input);
    NULLCHK(weight);
    NULLCHK(stride);
    NULLCHK(padding);
    NULLCHK(dilation);
    NULLCHK(outputPadding);
    NULLCHK(outputMask);
    NULLCHK(gradInput);
    NULLCHK(gradWeight);
    NULLCHK(workspaceSize);
    NULLCHK(executor);
    TRY(check_array_live(fn, "outputMask", outputMask, FAKECANN_KIND_BOOL_ARRAY));
    if (outputMask->size != 3)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: outputMask must have 3 values, got %llu", fn,
             (unsigned long long)outputMask->size);
    int m0 = outputMask->values[0], m1 = outputMask->values[1], m2 = outputMask->values[2];
    if (m2) {
        if (!biasSizes)
            FAIL(ACLNN_ERR_PARAM_NULLPTR, "%s: biasSizes must not be nullptr when outputMask[2] is true", fn);
        if (!gradBias)
            FAIL(ACLNN_ERR_PARAM_NULLPTR, "%s: gradBias must not be nullptr when outputMask[2] is true", fn);
    }
#undef NULLCHK

    /* liveness */
    TRY(check_live(fn, "gradOutput", gradOutput));
    TRY(check_live(fn, "input", input));
    TRY(check_live(fn, "weight", weight));
    TRY(check_live(fn, "gradInput", gradInput));
    TRY(check_live(fn, "gradWeight", gradWeight));
    if (gradBias) TRY(check_live(fn, "gradBias", gradBias));
    TRY(check_array_live(fn, "stride", stride, FAKECANN_KIND_INT_ARRAY));
    TRY(check_array_live(fn, "padding", padding, FAKECANN_KIND_INT_ARRAY));
    TRY(check_array_live(fn, "dilation", dilation, FAKECANN_KIND_INT_ARRAY));
    TRY(check_array_live(fn, "outputPadding", outputPadding, FAKECANN_KIND_INT_ARRAY));
    if (biasSizes) TRY(check_array_live(fn, "biasSizes", biasSizes, FAKECANN_KIND_INT_ARRAY));

    conv_geom g;
    TRY(validate_conv(fn, input, weight, stride, padding, dilation, transposed, outputPadding, groups,
                      cubeMathType, family, soc, &g));
    TRY(check_desc(fn, "gradOutput", gradOutput, input->dtype, weight->ndim));
    int dtype = input->dtype;
    int nsp = g.nsp;
    if (family == FAM_OLD && nsp == 3)
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: 3-D convolution backward is not supported on %s", fn, soc);
    if (family == FAM_A2) TRY(check_a2_limits(fn, &g, padding, soc));

    int64_t want[5];
    want[0] = g.N;
    want[1] = g.Cout;
    for (int j = 0; j < nsp; j++) want[2 + j] = g.ys[j];
    TRY(check_dims(fn, "gradOutput", gradOutput, want));

    if (biasSizes) {
        if (biasSizes->size != 1)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: biasSizes must have 1 value, got %llu", fn,
                 (unsigned long long)biasSizes->size);
        if (biasSizes->values[0] != g.Cout)
            FAIL(ACLNN_ERR_PARAM_INVALID, "%s: biasSizes[0] = %lld must equal the output channels %lld", fn,
                 (long long)biasSizes->values[0], (long long)g.Cout);
    }
    if (m0) {
        TRY(check_desc(fn, "gradInput", gradInput, dtype, input->ndim));
        TRY(check_dims(fn, "gradInput", gradInput, input->dims));
        TRY(check_out_contig(fn, "gradInput", gradInput));
    }
    if (m1) {
        TRY(check_desc(fn, "gradWeight", gradWeight, dtype, weight->ndim));
        TRY(check_dims(fn, "gradWeight", gradWeight, weight->dims));
        TRY(check_out_contig(fn, "gradWeight", gradWeight));
    }
    if (m2) {
        TRY(check_desc(fn, "gradBias", gradBias, dtype, 1));
        TRY(check_dims(fn, "gradBias", gradBias, &g.Cout));
        TRY(check_out_contig(fn, "gradBias", gradBias));
    }

    TRY(check_storage(fn, "gradOutput", gradOutput));
    TRY(check_storage(fn, "input", input));
    TRY(check_storage(fn, "weight", weight));
    if (m0) TRY(check_storage(fn, "gradInput", gradInput));
    if (m1) TRY(check_storage(fn, "gradWeight", gradWeight));
    if (m2) TRY(check_storage(fn, "gradBias", gradBias));

    aclOpExecutor *e = new_executor(FAKECANN_OP_CONV_BACKWARD);
    if (!e) FAIL(ACLNN_ERR_INNER_NULLPTR, "%s: out of memory", fn);
    e->t[T_GO] = gradOutput;
    e->t[T_X] = input;
    e->t[T_W] = weight;
    e->t[T_GI] = gradInput;
    e->t[T_GW] = gradWeight;
    e->t[T_GB] = gradBias;
    e->used[T_GO] = e->used[T_X] = e->used[T_W] = 1;
    e->used[T_GI] = m0;
    e->used[T_GW] = m1;
    e->used[T_GB] = m2;
    e->g = g;
    e->mask = (m0 ? 1 : 0) | (m1 ? 2 : 0) | (m2 ? 4 : 0);
    e->cube = cubeMathType;
    if (fakecann_priv_config()->phase1_delay_us) usleep(fakecann_priv_config()->phase1_delay_us);
    e->deterministic = fakecann_priv_process_deterministic();
    e->dtype = dtype;
    e->prec = precision_mode(dtype, cubeMathType, family);
    e->ws = fakecann_priv_config()->workspace_size;
    fakecann_priv_register(FAKECANN_KIND_EXECUTOR, e);
    fakecann_priv_count_prepare();
    *workspaceSize = e->ws;
    *executor = e;
    return ACLNN_SUCCESS;
}

/* -------------------------------------------------------- forward phase 1 */
aclnnStatus aclnnConvolutionGetWorkspaceSize(const aclTensor *input, const aclTensor *weight,
                                             const aclTensor *bias, const aclIntArray *stride,
                                             const aclIntArray *padding, const aclIntArray *dilation,
                                             bool transposed, const aclIntArray *outputPadding,
                                             const int64_t groups, aclTensor *output, int8_t cubeMathType,
                                             uint64_t *workspaceSize, aclOpExecutor **executor)
{
    const char *fn = FN_FWD;
    int inj = fakecann_priv_take_injection(fn);
    if (inj) return inj;
    const char *soc = fakecann_get_soc_name();
    int family = soc_family(soc);
#define NULLCHK(p)                                                                       \
    if (!(p)) FAIL(ACLNN_ERR_PARAM_NULLPTR, "%s: %s must not be nullptr", fn, #p)
    NULLCHK(input);
    NULLCHK(weight);
    NULLCHK(stride);
    NULLCHK(padding);
    NULLCHK(dilation);
    NULLCHK(outputPadding);
    NULLCHK(output);
    NULLCHK(workspaceSize);
    NULLCHK(executor);
#undef NULLCHK
    TRY(check_live(fn, "input", input));
    TRY(check_live(fn, "weight", weight));
    TRY(check_live(fn, "output", output));
    if (bias) TRY(check_live(fn, "bias", bias));
    TRY(check_array_live(fn, "stride", stride, FAKECANN_KIND_INT_ARRAY));
    TRY(check_array_live(fn, "padding", padding, FAKECANN_KIND_INT_ARRAY));
    TRY(check_array_live(fn, "dilation", dilation, FAKECANN_KIND_INT_ARRAY));
    TRY(check_array_live(fn, "outputPadding", outputPadding, FAKECANN_KIND_INT_ARRAY));

    conv_geom g;
    TRY(validate_conv(fn, input, weight, stride, padding, dilation, transposed, outputPadding, groups,
                      cubeMathType, family, soc, &g));
    int dtype = input->dtype;
    /* aclnnConvolution.md (constraints, cubeMathType row): on Atlas A2/A3 a FLOAT input with
     * 0 (KEEP_DTYPE) is not supported by the forward operator (the backward one accepts it). */
    if (family == FAM_A2 && dtype == ACL_FLOAT && cubeMathType == FC_KEEP_DTYPE)
        FAIL(ACLNN_ERR_PARAM_INVALID,
             "%s: FLOAT input with cubeMathType 0 (KEEP_DTYPE) is not supported on %s "
             "(use 1/3 for HFLOAT32 or 2 USE_FP16)", fn, soc);
    int64_t want[5];
    want[0] = g.N;
    want[1] = g.Cout;
    for (int j = 0; j < g.nsp; j++) want[2 + j] = g.ys[j];
    TRY(check_desc(fn, "output", output, dtype, input->ndim));
    TRY(check_dims(fn, "output", output, want));
    TRY(check_out_contig(fn, "output", output));
    if (bias) {
        TRY(check_desc(fn, "bias", bias, dtype, 1));
        TRY(check_dims(fn, "bias", bias, &g.Cout));
    }
    TRY(check_storage(fn, "input", input));
    TRY(check_storage(fn, "weight", weight));
    if (bias) TRY(check_storage(fn, "bias", bias));
    TRY(check_storage(fn, "output", output));

    aclOpExecutor *e = new_executor(FAKECANN_OP_CONV_FORWARD);
    if (!e) FAIL(ACLNN_ERR_INNER_NULLPTR, "%s: out of memory", fn);
    e->t[F_X] = input;
    e->t[F_W] = weight;
    e->t[F_B] = bias;
    e->t[F_Y] = output;
    e->used[F_X] = e->used[F_W] = e->used[F_Y] = 1;
    e->used[F_B] = bias != NULL;
    e->g = g;
    e->mask = 0;
    e->cube = cubeMathType;
    if (fakecann_priv_config()->phase1_delay_us) usleep(fakecann_priv_config()->phase1_delay_us);
    e->deterministic = fakecann_priv_process_deterministic();
    e->dtype = dtype;
    e->prec = precision_mode(dtype, cubeMathType, family);
    e->ws = fakecann_priv_config()->workspace_size;
    fakecann_priv_register(FAKECANN_KIND_EXECUTOR, e);
    fakecann_priv_count_prepare();
    *workspaceSize = e->ws;
    *executor = e;
    return ACLNN_SUCCESS;
}

/* --------------------------------------------------------------- phase 2 */
static const char *const BWD_NAMES[6] = {"gradOutput", "input", "weight", "gradInput", "gradWeight", "gradBias"};
static const char *const FWD_NAMES[6] = {"input", "weight", "bias", "output", "", ""};

static int run_backward(const aclOpExecutor *e)
{
    cgeom c = to_cgeom(&e->g);
    double *go = load_tensor(e->t[T_GO], e->prec);
    double *x = load_tensor(e->t[T_X], e->prec);
    double *w = load_tensor(e->t[T_W], e->prec);
    double *gi = NULL, *gw = NULL, *gb = NULL, *go_exact = NULL;
    int rc = ACLNN_ERR_INNER_NULLPTR;
    if (!go || !x || !w) goto out;
    const double *A = e->g.transposed ? go : x; /* A-space: x (direct) / y (transposed) */
    const double *B = e->g.transposed ? x : go;
    if (e->mask & 1) {
        gi = malloc((size_t)(numel(e->t[T_X]) > 0 ? numel(e->t[T_X]) : 1) * sizeof(double));
        if (!gi) goto out;
        if (e->g.transposed)
            k_corr(&c, go, w, gi);
        else
            k_scatter(&c, go, w, gi);
        store_tensor(e->t[T_GI], gi);
    }
    if (e->mask & 2) {
        gw = malloc((size_t)numel(e->t[T_W]) * sizeof(double));
        if (!gw) goto out;
        k_wgrad(&c, A, B, gw);
        store_tensor(e->t[T_GW], gw);
    }
    if (e->mask & 4) {
        /* bias gradient is a plain reduction (not a cube op): full precision */
        const double *src = go;
        if (e->prec != PREC_EXACT) {
            go_exact = load_tensor(e->t[T_GO], PREC_EXACT);
            if (!go_exact) goto out;
            src = go_exact;
        }
        int64_t C = e->g.Cout, sp = 1;
        for (int j = 0; j < e->g.nsp; j++) sp *= e->g.ys[j];
        gb = calloc((size_t)C, sizeof(double));
        if (!gb) goto out;
        for (int64_t n = 0; n < e->g.N; n++)
            for (int64_t ch = 0; ch < C; ch++)
                for (int64_t i = 0; i < sp; i++) gb[ch] += src[(n * C + ch) * sp + i];
        store_tensor(e->t[T_GB], gb);
    }
    rc = ACLNN_SUCCESS;
out:
    free(go);
    free(go_exact);
    free(x);
    free(w);
    free(gi);
    free(gw);
    free(gb);
    return rc;
}

static int run_forward(const aclOpExecutor *e)
{
    cgeom c = to_cgeom(&e->g);
    double *x = load_tensor(e->t[F_X], e->prec);
    double *w = load_tensor(e->t[F_W], e->prec);
    double *b = e->t[F_B] ? load_tensor(e->t[F_B], PREC_EXACT) : NULL;
    int64_t ny = numel(e->t[F_Y]);
    double *y = malloc((size_t)(ny > 0 ? ny : 1) * sizeof(double));
    int rc = ACLNN_ERR_INNER_NULLPTR;
    if (!x || !w || !y || (e->t[F_B] && !b)) goto out;
    if (e->g.transposed)
        k_scatter(&c, x, w, y);
    else
        k_corr(&c, x, w, y);
    if (b) {
        int64_t C = e->g.Cout, sp = 1;
        for (int j = 0; j < e->g.nsp; j++) sp *= e->g.ys[j];
        for (int64_t n = 0; n < e->g.N; n++)
            for (int64_t ch = 0; ch < C; ch++)
                for (int64_t i = 0; i < sp; i++) y[(n * C + ch) * sp + i] += b[ch];
    }
    store_tensor(e->t[F_Y], y);
    rc = ACLNN_SUCCESS;
out:
    free(x);
    free(w);
    free(b);
    free(y);
    return rc;
}

static aclnnStatus execute(const char *fn, int op, void *workspace, uint64_t workspaceSize,
                           aclOpExecutor *executor, aclrtStream stream)
{
    if (!executor) FAIL(ACLNN_ERR_PARAM_NULLPTR, "%s: executor must not be nullptr", fn);
    if (!fakecann_priv_unregister(FAKECANN_KIND_EXECUTOR, executor)) {
        fakecann_priv_misuse();
        FAIL(ACLNN_ERR_PARAM_INVALID, "%s: executor %p is not live (already consumed by a previous call?)",
             fn, (void *)executor);
    }
    /* from here on the executor is consumed whatever happens */
    aclOpExecutor *e = executor;
    int rc = ACLNN_SUCCESS;
    const char *const *names = op == FAKECANN_OP_CONV_BACKWARD ? BWD_NAMES : FWD_NAMES;
    int inj = fakecann_priv_take_injection(fn);
    if (inj) {
        rc = inj;
        goto done;
    }
    if (e->op != op) {
        ERR("%s: executor was created by %s", fn, e->op == FAKECANN_OP_CONV_BACKWARD ? FN_BWD : FN_FWD);
        rc = ACLNN_ERR_PARAM_INVALID;
        goto done;
    }
    if (workspaceSize < e->ws) {
        ERR("%s: workspaceSize %llu is smaller than the %llu bytes requested by phase 1", fn,
            (unsigned long long)workspaceSize, (unsigned long long)e->ws);
        rc = ACLNN_ERR_PARAM_INVALID;
        goto done;
    }
    if (e->ws > 0 && !workspace) {
        ERR("%s: workspace must not be nullptr (phase 1 requested %llu bytes)", fn, (unsigned long long)e->ws);
        rc = ACLNN_ERR_PARAM_INVALID;
        goto done;
    }
    if (e->ws > 0 && fakecann_priv_config()->check_device_ptr &&
        !fakecann_priv_in_device_mem(workspace, e->ws)) {
        ERR("%s: workspace %p (%llu bytes) is not inside live device memory", fn, workspace,
            (unsigned long long)e->ws);
        rc = ACLNN_ERR_PARAM_INVALID;
        goto done;
    }
    if (!fakecann_priv_has_context()) {
        ERR("%s: no current context on this thread (call aclrtSetDevice first)", fn);
        rc = ACL_ERROR_RT_CONTEXT_NULL;
        goto done;
    }
    if (stream && !fakecann_priv_is_live(FAKECANN_KIND_STREAM, stream)) {
        ERR("%s: stream %p is not a live stream", fn, stream);
        rc = ACLNN_ERR_PARAM_INVALID;
        goto done;
    }
    for (int i = 0; i < 6; i++) {
        if (!e->used[i]) continue;
        if (!fakecann_priv_is_live(FAKECANN_KIND_TENSOR, e->t[i])) {
            ERR("%s: tensor %s was destroyed between the two phases", fn, names[i]);
            rc = ACLNN_ERR_PARAM_INVALID;
            goto done;
        }
        rc = check_storage(fn, names[i], e->t[i]);
        if (rc) goto done;
    }

    fakecann_priv_record_t rec;
    memset(&rec, 0, sizeof rec);
    rec.op = op;
    rec.deterministic = e->deterministic;  /* as read at phase 1 */
    rec.cube_math = e->cube;
    rec.mask = e->mask;
    rec.transposed = e->g.transposed;
    rec.groups = e->g.G;
    rec.dtype = e->dtype;
    rec.stream = stream;
    rec.workspace_size = workspaceSize;
    fakecann_priv_record(&rec);

    if (e->ws > 0) memset(workspace, 0xA5, (size_t)e->ws);
    rc = op == FAKECANN_OP_CONV_BACKWARD ? run_backward(e) : run_forward(e);
    if (rc) ERR("%s: internal error (out of memory)", fn);
done:
    e->magic = 0;
    free(e);
    return rc;
}

aclnnStatus aclnnConvolutionBackward(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                     aclrtStream stream)
{
    return execute("aclnnConvolutionBackward", FAKECANN_OP_CONV_BACKWARD, workspace, workspaceSize, executor,
                   stream);
}

aclnnStatus aclnnConvolution(void *workspace, const uint64_t workspaceSize, aclOpExecutor *executor,
                             aclrtStream stream)
{
    return execute("aclnnConvolution", FAKECANN_OP_CONV_FORWARD, workspace, workspaceSize, executor, stream);
}
