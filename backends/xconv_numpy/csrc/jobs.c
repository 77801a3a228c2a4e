/* A list of jobs (calls of this library's loops) run by several threads without Python (see ../jobs.py).
 *
 * A job is XJ_LEN int64: kind, the phase it waits for (-1: none) and the count of that phase's jobs that must be
 * done first, the phase it counts in when done (-1: none), then its call's arguments (pointers as integers). The
 * threads take jobs in list order (an atomic counter), so a job waits only for jobs a running thread has taken:
 * no deadlock whatever the number of threads. Each thread takes a slot, and its scratch (state[XS_SCRATCH] +
 * slot * state[XS_STRIDE] floats) for the jobs that need one. What a job computes never depends on the thread
 * that runs it. xconv_jobs_parallel runs the list on an OpenMP team through the GOMP_parallel given (torch's
 * libgomp, found by ../omp_team.py): the whole region runs in C, the caller's GIL released by ctypes. */

#if defined(__unix__) || defined(__APPLE__)
#include <sched.h>
#endif

#define XJ_LEN 24
enum { XJ_DWCV_GATHER = 1, XJ_DWCV_WGRAD = 2, XJ_DY_TO_GRID = 3, XJ_X_TO_GRID = 4, XJ_DX_ROWS = 5, XJ_DW_ROWS = 6,
       XJ_SGEMM = 7, XJ_SGEMM_BATCH = 8,
       XJ_IM2COL = 9, XJ_COL2IM = 10, XJ_STEM_ROWS = 11, XJ_STEM_PHASES = 12, XJ_STEM_WGRAD = 13,
       XJ_DW_FPROP = 14, XJ_DW_BACKWARD = 15, XJ_TAPS_LAST = 16, XJ_SMALL_FPROP = 17,
       XJ_SMALL_BACKWARD = 18 };
/* NumPy's own ILP64 cblas_sgemm (its address a job's first argument): C = A @ B, row-major, as numpy.matmul calls it */
typedef void (*xj_sgemm64)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *,
                           int64_t, float, float *, int64_t);
/* state: next job, next slot, done counts of phases 0..3, scratch base, scratch floats per slot */
enum { XS_NEXT = 0, XS_SLOT = 1, XS_DONE = 2, XS_PHASES = 4, XS_SCRATCH = 6, XS_STRIDE = 7, XS_LEN = 8 };

#define P(k) ((void *)(intptr_t)a[k])

static void xj_dispatch(const int64_t *j, float *scratch) {
    const int64_t *a = j + 4;
    switch (j[0]) {
    case XJ_DWCV_GATHER:
        xconv_dwcv_gather(P(0), a[1], a[2], a[3], P(4), a[5], a[6], P(7), a[8], P(9), P(10), P(11), P(12), P(13),
                          a[14], a[15], a[16], scratch);
        break;
    case XJ_DWCV_WGRAD:
        xconv_dwcv_wgrad(P(0), P(1), a[2], a[3], a[4], a[5], a[6], a[7], a[8], P(9), P(10), P(11), P(12), P(13),
                         P(14), a[15], a[16], scratch);
        break;
    case XJ_DY_TO_GRID:
        xconv_dy_to_grid(P(0), a[1], a[2], P(3), a[4], a[5], a[6], a[7], a[8], a[9], a[10], P(11), P(12));
        break;
    case XJ_X_TO_GRID:
        xconv_x_to_grid(P(0), a[1], a[2], a[3], a[4], a[5], P(6), a[7], a[8], P(9), a[10], P(11), a[12],
                        P(13));
        break;
    case XJ_DX_ROWS:
        xconv_dx_rows(P(0), a[1], a[2], P(3), a[4], a[5], P(6), a[7], a[8], a[9], P(10), a[11], a[12], a[13], P(14),
                      P(15), a[16], a[17], a[18], a[19]);
        break;
    case XJ_DW_ROWS:
        xconv_dw_rows(P(0), a[1], a[2], P(3), a[4], a[5], a[6], P(7), a[8], a[9], P(10), P(11), a[12], a[13], a[14],
                      P(15), a[16], a[17], a[18], a[19]);
        break;
    case XJ_SGEMM:      /* fn, transA, transB, M, N, K, A, lda, B, ldb, C, ldc */
        ((xj_sgemm64)P(0))(101, (int)a[1], (int)a[2], a[3], a[4], a[5], 1.0f, P(6), a[7], P(8), a[9], 0.0f, P(10),
                           a[11]);
        break;
    case XJ_SGEMM_BATCH: {  /* as XJ_SGEMM for items [a[15], a[16]), item i's A, B, C at i * (a[12], a[13], a[14]) bytes */
        const char *A = P(6), *B = P(8);
        char *C = P(10);
        for (int64_t i = a[15]; i < a[16]; i++)
            ((xj_sgemm64)P(0))(101, (int)a[1], (int)a[2], a[3], a[4], a[5], 1.0f, (const float *)(A + i * a[12]), a[7],
                               (const float *)(B + i * a[13]), a[9], 0.0f, (float *)(C + i * a[14]), a[11]);
        break;
    }
    case XJ_IM2COL:     /* x, cols, geo (float32), channels [c0, c1) */
        xconv_small_im2col_range_f32(P(0), P(1), P(2), a[3], a[4]);
        break;
    case XJ_COL2IM:     /* dcols, dx, geo (float32), channels [c0, c1) */
        xconv_small_col2im_range_f32(P(0), P(1), P(2), a[3], a[4]);
        break;
    case XJ_STEM_ROWS:  /* x, w, bias (0: none), y, geo, Co, output rows [r0, r1) (float32; the thread's scratch) */
        xconv_stem_fprop_rows(P(0), P(1), P(2), P(3), P(4), a[5], a[6], a[7], scratch);
        break;
    case XJ_STEM_PHASES:    /* x, phase rows, geo, x's rows [r0, r1), floats per phase row (0: the stem's), inter */
        xconv_stem_phases(P(0), P(1), P(2), a[3], a[4], a[5], a[6]);
        break;
    case XJ_STEM_WGRAD:     /* phase rows, dy, dw, geo, Co, jobs [j0, j1) */
        xconv_stem_wgrad(P(0), P(1), P(2), P(3), a[4], a[5], a[6]);
        break;
    case XJ_DW_FPROP:       /* x, w, y, geo, taps, tab, the scratch's second part at float a[6], planes [a[7], a[8])
                             * (depthwise_impl.h, float32; the thread's scratch holds g, then xph) */
        xconv_depthwise_fprop_f32(P(0), P(1), P(2), P(3), P(4), P(5), scratch, scratch + a[6], a[7], a[8]);
        break;
    case XJ_DW_BACKWARD:    /* dy, x, w, dx, dwp, dbp, geo, taps, tab, the scratch's parts at floats a[9] and a[10],
                             * planes [a[11], a[12]) (depthwise_impl.h, float32; the scratch holds g, xph, acc) */
        xconv_depthwise_backward_f32(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), scratch, scratch + a[9],
                                     scratch + a[10], a[11], a[12]);
        break;
    case XJ_TAPS_LAST:      /* src, K, R, dst, rows [r0, r1) (direct_conv.c) */
        xconv_taps_last(P(0), a[1], a[2], P(3), a[4], a[5]);
        break;
    case XJ_SMALL_FPROP:    /* x, w, bias (0: none), y, plan, x's strides, out: {status, scratch bytes} (float32; a
                             * block of samples: the plan's N; small_grid_impl.h) */
        ((int64_t *)P(6))[0] = xconv_small_s1_fprop_f32(P(0), P(1), P(2), P(3), P(4), P(5), (int64_t *)P(6) + 1);
        break;
    case XJ_SMALL_BACKWARD: /* dy, x (0: no dw), w (0: no dx), dx (0: none), dw (0: none), plan, dy's strides, x's
                             * strides (0: none), out: {status, scratch bytes} (float32; a block of samples: the plan's N;
                             * no db; status 2: an input read holds an inf or a NaN) */
        ((int64_t *)P(8))[0] = xconv_small_s1_backward_f32(P(0), P(1), P(2), P(3), P(4), NULL, P(5), P(6), P(7),
                                                           (int64_t *)P(8) + 1);
        break;
    default:
        break;
    }
}
#undef P

static inline void xj_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* A wait's spin-th round: a pause, and past XJ_SPINS rounds the core handed to another thread (where the threads
 * outnumber the free cores, as under a CPU quota or on a busy machine, the job waited for may be on this core). */
#define XJ_SPINS 4096
static inline void xj_wait(int spins) {
#if defined(__unix__) || defined(__APPLE__)
    if (spins >= XJ_SPINS) {
        sched_yield();
        return;
    }
#endif
    xj_pause();
}

/* One thread's share of the list: jobs taken in order until none is left. */
void xconv_jobs_work(const int64_t *jobs, int64_t n, int64_t *state) {
    const int64_t slot = __atomic_fetch_add(&state[XS_SLOT], 1, __ATOMIC_RELAXED);
    float *scratch = (float *)(intptr_t)state[XS_SCRATCH] + slot * state[XS_STRIDE];
    for (;;) {
        const int64_t i = __atomic_fetch_add(&state[XS_NEXT], 1, __ATOMIC_ACQ_REL);
        if (i >= n) return;
        const int64_t *j = jobs + i * XJ_LEN;
        if (j[1] >= 0 && j[1] < XS_PHASES)
            for (int spins = 0; __atomic_load_n(&state[XS_DONE + j[1]], __ATOMIC_ACQUIRE) < j[2]; spins++)
                xj_wait(spins);
        xj_dispatch(j, scratch);
        if (j[3] >= 0 && j[3] < XS_PHASES) __atomic_fetch_add(&state[XS_DONE + j[3]], 1, __ATOMIC_RELEASE);
    }
}

struct xj_run { const int64_t *jobs; int64_t n; int64_t *state; };

static void xj_body(void *p) {
    struct xj_run *r = p;
    xconv_jobs_work(r->jobs, r->n, r->state);
}

typedef void (*xj_gomp_parallel)(void (*)(void *), void *, unsigned, unsigned);

/* The list on `threads` threads of an OpenMP team (the caller among them), through `gomp_parallel`. */
void xconv_jobs_parallel(const int64_t *jobs, int64_t n, int64_t *state, int64_t threads, void *gomp_parallel) {
    struct xj_run r = {jobs, n, state};
    ((xj_gomp_parallel)gomp_parallel)(xj_body, &r, (unsigned)threads, 0);
}

/* The job record's length and the state's (checked against ../jobs.py at load). */
int64_t xconv_jobs_layout(int which) { return which == 0 ? XJ_LEN : which == 1 ? XS_LEN : -1; }
