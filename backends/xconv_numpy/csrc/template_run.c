/* A job template's run in one call from Python (../jobs.py, Template.run): the table copied, each address argument's
 * base added (the bases given as the call's arrays, read through the buffer protocol, or as integers), the state and
 * scratch made, and the jobs run (jobs.c), the GIL released while they run. The same table, so the same jobs and
 * bits, as the Python route; what it saves is that route's Python per call (about 40 us of a converted layer's call
 * with the caches cold: the base addresses, the table's copy and fill, the state and scratch arrays).
 *
 * Called through ctypes.PyDLL (the GIL held on entry: the buffer protocol needs it). Returns the scratch bytes used,
 * -1 with a Python exception set (a base that is neither None, an int nor a buffer of one dimension or more; a table
 * of another size), or -2
 * when more than one thread is asked and no OpenMP team is usable from here (no GOMP_parallel given, or this thread
 * already in a parallel region): nothing was run, the caller runs the list on its Python workers. */
#include <stdlib.h>
#include <string.h>

typedef int (*xt_in_parallel)(void);

static int xt_ints(PyObject *o, Py_buffer *v, Py_ssize_t itemsize) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (v->len % itemsize) {
        PyBuffer_Release(v);
        PyErr_SetString(PyExc_ValueError, "template table of another item size");
        return -1;
    }
    return 0;
}

/* bases[k] = the address of item k of `items` (None: 0; an int; else the first element of its buffer, which must have
 * one dimension or more: a NumPy integer scalar offers a 0-d buffer of its own object, never an array's address) */
static int xt_bases(PyObject *items, int64_t *bases, Py_ssize_t n) {
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = PyTuple_GET_ITEM(items, k);
        if (o == Py_None) {
            bases[k] = 0;
        } else if (PyLong_Check(o)) {
            bases[k] = (int64_t)PyLong_AsLongLong(o);
            if (bases[k] == -1 && PyErr_Occurred()) return -1;
        } else {
            Py_buffer v;
            if (PyObject_GetBuffer(o, &v, PyBUF_STRIDED_RO) < 0) return -1;
            const int ndim = v.ndim;
            bases[k] = (int64_t)(intptr_t)v.buf;
            PyBuffer_Release(&v);
            if (ndim < 1) {
                PyErr_Format(PyExc_TypeError, "template base %zd: an array of one dimension or more, an int or None, "
                             "not a 0-d %s", k, Py_TYPE(o)->tp_name);
                return -1;
            }
        }
    }
    bases[n] = 0;                                   /* the number past the items: no base (Template's convention) */
    return 0;
}

int64_t xconv_template_run(PyObject *table, PyObject *flat, PyObject *flat_base, PyObject *items, int64_t threads,
                           int64_t scratch_floats, void *gomp_parallel, void *in_parallel) {
    if (!PyTuple_Check(items)) {
        PyErr_SetString(PyExc_TypeError, "template bases: a tuple of arrays, ints or None");
        return -1;
    }
    const Py_ssize_t nb = PyTuple_GET_SIZE(items);
    int64_t *bases = PyMem_Malloc((size_t)(nb + 1) * sizeof(int64_t));
    if (bases == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_buffer tb, fb, bb;
    if (xt_bases(items, bases, nb) < 0 || xt_ints(table, &tb, (Py_ssize_t)(XJ_LEN * sizeof(int64_t))) < 0) {
        PyMem_Free(bases);
        return -1;
    }
    if (xt_ints(flat, &fb, (Py_ssize_t)sizeof(intptr_t)) < 0) {
        PyBuffer_Release(&tb);
        PyMem_Free(bases);
        return -1;
    }
    if (xt_ints(flat_base, &bb, (Py_ssize_t)sizeof(intptr_t)) < 0) {
        PyBuffer_Release(&tb);
        PyBuffer_Release(&fb);
        PyMem_Free(bases);
        return -1;
    }
    int64_t result = 0;
    int64_t *jobs = NULL;
    float *scratch = NULL;
    if (bb.len != fb.len) {
        PyErr_SetString(PyExc_ValueError, "template: flat positions and bases differ in length");
        result = -1;
        goto done;
    }
    const int64_t n = (int64_t)(tb.len / (Py_ssize_t)(XJ_LEN * sizeof(int64_t)));
    const Py_ssize_t nflat = fb.len / (Py_ssize_t)sizeof(intptr_t);
    const intptr_t *at = fb.buf, *base_of = bb.buf;
    if (threads > n) threads = n;
    if (threads < 1) threads = 1;
    if (n == 0) goto done;
    if (threads > 1 && (gomp_parallel == NULL || in_parallel == NULL || ((xt_in_parallel)in_parallel)())) {
        result = -2;
        goto done;
    }
    for (Py_ssize_t k = 0; k < nflat; k++)
        if (at[k] < 0 || at[k] >= n * XJ_LEN || base_of[k] < 0 || base_of[k] > nb) {
            PyErr_SetString(PyExc_IndexError, "template: an address argument out of the table");
            result = -1;
            goto done;
        }
    jobs = malloc((size_t)tb.len);
    if (scratch_floats > 0)
        scratch = aligned_alloc(64, ((size_t)(threads * scratch_floats) * sizeof(float) + 63) / 64 * 64);
    if (jobs == NULL || (scratch_floats > 0 && scratch == NULL)) {
        PyErr_NoMemory();
        result = -1;
        goto done;
    }
    memcpy(jobs, tb.buf, (size_t)tb.len);
    for (Py_ssize_t k = 0; k < nflat; k++) jobs[at[k]] += bases[base_of[k]];
    int64_t state[XS_LEN] = {0};
    state[XS_SCRATCH] = (int64_t)(intptr_t)scratch;
    state[XS_STRIDE] = scratch_floats;
    Py_BEGIN_ALLOW_THREADS
    if (threads == 1)
        xconv_jobs_work(jobs, n, state);
    else
        xconv_jobs_parallel(jobs, n, state, threads, gomp_parallel);
    Py_END_ALLOW_THREADS
    result = state[XS_SLOT] * scratch_floats * (int64_t)sizeof(float);
done:
    free(jobs);
    free(scratch);
    PyMem_Free(bases);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&fb);
    PyBuffer_Release(&bb);
    return result;
}
