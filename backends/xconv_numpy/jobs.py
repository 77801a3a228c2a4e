"""Lists of compiled-loop calls run by several threads in C (csrc/jobs.c): no Python between a region's calls.

A path that splits its work into calls of the compiled loops (the depthwise loops across channels, the dense
loops' copies and sums) builds a :class:`Jobs` list and runs it: on torch's OpenMP team when torch's libgomp is
in the process (:mod:`.omp_team`; the region runs in C, the caller's GIL released), else on the Python workers
(:mod:`.workers`), each worker one C call that takes jobs until none is left. Either way the threads take jobs in
list order and a job may wait for the jobs of an earlier phase (the dense loops' sums wait for their copies), so
nothing waits for a job no running thread has taken. Each job computes a fixed part of the outputs, whatever
thread runs it: results never depend on the number of threads. A region costs a few microseconds on the team
(measured: an empty region of Python callbacks 10-30 us; two 64x64 products on two Python workers 48 us).
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np

from . import native, omp_team, workers
from .blas import sgemm64_address
from .layout import JOB_LEN as LEN, JOB_STATE as STATE     # checked against the library at load (layout.check)

KINDS = {"dwcv_gather": 1, "dwcv_wgrad": 2, "dy_to_grid": 3, "x_to_grid": 4, "dx_rows": 5, "dw_rows": 6,
         "sgemm": 7, "sgemm_batch": 8, "im2col": 9, "col2im": 10, "stem_rows": 11,
         "stem_phases": 12, "stem_wgrad": 13, "dw_fprop": 14, "dw_backward": 15, "taps_last": 16,
         "small_fprop": 17, "small_backward": 18}


class Jobs:
    """A list of jobs under construction (arguments: ints, or addresses of arrays the caller keeps alive)."""

    def __init__(self):
        self.blocks: list = []
        self.count = 0

    def add(self, kind: str, *args, wait: tuple | None = None, signal: int | None = None) -> None:
        """Job ``kind`` with ``args`` (None: a NULL pointer); it starts when ``wait`` = (phase, count) jobs of that
        phase are done, and counts in phase ``signal`` when done."""
        self.rows(kind, [[0 if a is None else a for a in args]], wait=wait, signal=signal)

    def split(self, kind: str, args, at: int, ranges, wait: tuple | None = None, signal: int | None = None) -> None:
        """One job of ``kind`` per [a, b) range of ``ranges``: ``args`` with a and b as arguments ``at`` and ``at + 1``."""
        table = np.repeat(np.array([list(args) + [0] * max(0, at + 2 - len(args))], np.int64), len(ranges), axis=0)
        table[:, at:at + 2] = ranges
        self.rows(kind, table, wait=wait, signal=signal)

    def rows(self, kind: str, args, wait: tuple | None = None, signal: int | None = None) -> None:
        """One job of ``kind`` per row of ``args`` (rows of ints or addresses, all of one length: one NumPy table,
        no Python call per job)."""
        args = np.asarray(args, np.int64)
        if args.shape[1] > LEN - 4:
            raise ValueError(f"a job takes at most {LEN - 4} arguments, given {args.shape[1]}")
        phase, count = wait if wait is not None else (-1, 0)
        block = np.zeros((len(args), LEN), np.int64)
        block[:, :4] = KINDS[kind], phase, count, -1 if signal is None else signal
        block[:, 4:4 + args.shape[1]] = args
        self.blocks.append(block)
        self.count += len(args)

    def __len__(self) -> int:
        return self.count

    @classmethod
    def concatenated(cls, lists) -> "Jobs":
        """One list of the jobs of ``lists``, in order (their rows shared, not copied)."""
        out = cls()
        for jobs in lists:
            out.blocks += jobs.blocks
            out.count += jobs.count
        return out

    def run(self, threads: int, scratch_floats: int = 0) -> int:
        """Run every job on up to ``threads`` threads, each with ``scratch_floats`` floats of scratch; returns the
        scratch bytes used."""
        if self.count == 0:
            return 0
        table = self.blocks[0] if len(self.blocks) == 1 else np.concatenate(self.blocks)
        return _execute(table, threads, scratch_floats)

    def template(self, args, bases) -> "Template":
        """These jobs as a :class:`Template` (see :meth:`Template.joined`)."""
        return Template.joined([(self, args)], bases)

    def table(self) -> np.ndarray:
        """The jobs' rows (a copy)."""
        return np.concatenate(self.blocks) if self.blocks else np.zeros((0, LEN), np.int64)


class Template:
    """A job list fixed by a call's configuration: address arguments held as offsets from the call's arrays, so a
    repeated call adds its arrays' addresses to a copy of the table and runs it (no Python per job, no rebuilding)."""

    __slots__ = ("table", "flat", "flat_base")

    def __init__(self, table: np.ndarray, cols: tuple, base_of: np.ndarray):
        """``table``'s rows with the arguments at columns ``cols`` held as offsets from the base addresses numbered
        ``base_of[row, k]``: kept as flat positions in the table and the base each adds (one 1-D gather and add a run:
        a third of the time of indexing the table's columns)."""
        self.table = table
        self.flat = (np.arange(len(table))[:, None] * table.shape[1] + np.asarray(cols, np.intp)[None, :]).ravel()
        self.flat_base = np.ascontiguousarray(base_of).ravel()
        for a in (table, self.flat, self.flat_base):
            a.flags.writeable = False

    @classmethod
    def joined(cls, parts, bases) -> "Template":
        """One template of the job lists ``parts`` = [(jobs, {argument: k})], in order: each argument of a part's
        mapping, built from base ``bases[k]`` (as :meth:`run` takes them), held as its offset from that address."""
        addresses = addresses_of(bases)
        args = sorted({arg for _, numbers in parts for arg in numbers})
        tables, base_of = [], []
        for jobs, numbers in parts:
            table = jobs.table()
            for arg, k in numbers.items():
                table[:, 4 + arg] -= addresses[k]
            tables.append(table)
            base_of.append(np.repeat([[numbers.get(arg, len(addresses)) for arg in args]], len(table), axis=0))
        return cls(np.concatenate(tables), tuple(4 + a for a in args), np.concatenate(base_of).astype(np.intp))

    def run(self, bases, threads: int, scratch_floats: int = 0) -> int:
        """Run the jobs with ``bases`` (by number: the arrays whose first elements' addresses they add, or the
        addresses as ints; None: 0) on up to ``threads`` threads, as :meth:`Jobs.run`: in one C call
        (csrc/template_run.c) where the library has it, else filled here and run by :func:`_run_table`."""
        return _execute_template(self, tuple(bases), threads, scratch_floats)


def _execute_template(template: Template, bases: tuple, threads: int, scratch_floats: int) -> int:
    """One region of ``template``'s jobs on ``bases`` (see :meth:`Template.run`); the scratch bytes used."""
    fn = _template_run()
    if fn is not None:
        used = fn(template.table, template.flat, template.flat_base, bases, threads, scratch_floats,
                  *omp_team.team_functions())
        if used != -2:                                  # -2: more than one thread and no team here (nothing ran)
            return used
    table = template.table.copy()
    table.ravel()[template.flat] += np.array(addresses_of(bases) + (0,), np.int64)[template.flat_base]
    return _run_table(table, threads, scratch_floats)


def addresses_of(bases) -> tuple:
    """The addresses of a template's ``bases``: an array's first element's, an int as it is, 0 for None."""
    return tuple(0 if a is None else a if type(a) is int else native.address(a) for a in bases)


#: The loaded library's xconv_template_run as a ctypes.PyDLL function (the GIL held on entry), per library.
_TEMPLATE_RUN: dict = {}


def _template_run():
    """xconv_template_run of the loaded build (Template.run's one C call), or None (no compiled loops)."""
    lib = native.LIBRARY._value or native.LIBRARY.get()     # native.library() (Lazy.get's loaded case in line)
    if lib is None:
        return None
    fn = _TEMPLATE_RUN.get(lib._name)
    if fn is None:
        fn = ctypes.PyDLL(lib._name).xconv_template_run
        fn.argtypes = [ctypes.py_object] * 4 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int64
        _TEMPLATE_RUN[lib._name] = fn
    return fn


def _execute(table: np.ndarray, threads: int, scratch_floats: int) -> int:
    """One region of :meth:`Jobs.run`: :func:`_run_table`."""
    return _run_table(table, threads, scratch_floats)


def _run_table(table: np.ndarray, threads: int, scratch_floats: int) -> int:
    """Run the jobs of ``table`` (rows of LEN) on up to ``threads`` threads; the scratch bytes used."""
    n = len(table)
    if n == 0:
        return 0
    lib = native.library()
    threads = max(1, min(threads, n))
    state = np.zeros(STATE, np.int64)
    if scratch_floats:                          # else no scratch: a job that takes some is never run with none
        scratch = np.empty(threads * scratch_floats, np.float32)
        state[6], state[7] = native.address(scratch), scratch_floats
    at, st = native.address(table), native.address(state)
    if threads == 1:
        lib.xconv_jobs_work(at, n, st)
    else:
        gomp = omp_team.gomp_parallel_address()
        if gomp is not None:
            lib.xconv_jobs_parallel(at, n, st, threads, gomp)
        else:
            workers.run([()] * threads, lambda _ws, _i: lib.xconv_jobs_work(at, n, st), lambda: None, threads,
                        pin_blas=False)          # the loops call no BLAS; sgemm jobs' callers pin it
    return int(state[1]) * scratch_floats * 4


def sgemm_available() -> bool:
    """Whether products can run as sgemm jobs: the compiled loops loaded and NumPy's ILP64 ``cblas_sgemm`` found."""
    return native.library() is not None and sgemm64_address() is not None


def sgemm(views, workers: int) -> bool:
    """out = x @ y for every (x, y, out) of ``views`` as jobs calling numpy.matmul's own sgemm (see
    :func:`sgemm_calls`): the bits of ``numpy.matmul(x, y, out=out)``; False, nothing run, when some product is one
    numpy would run otherwise. Called with BLAS pinned to one thread (:mod:`.blas`), as the paths do: a threaded
    OpenBLAS called from several threads at once serializes, and inside an OpenMP team warns of a hang."""
    calls = sgemm_calls(views)
    if calls is None:
        return False
    jobs = Jobs()
    jobs.rows("sgemm", calls)
    jobs.run(workers)
    return True


def sgemm_stack(a: np.ndarray, b: np.ndarray, out: np.ndarray, workers: int) -> bool:
    """out[i] = a[i] @ b[i] for every index i of the three arrays' leading (batch) dimensions (a or b may be
    broadcast: stride 0), as :func:`sgemm` (each product the ``cblas_sgemm`` call numpy.matmul makes for it: the bits
    of ``numpy.matmul(a, b, out=out)``), the first batch dimension's items taken one job each (csrc/jobs.c's batch
    job: no Python per product); False, nothing run, where :func:`sgemm` would refuse. ``out`` is written in
    place: it must not overlap ``a`` or ``b``, nor itself across items (numpy.matmul would copy first; the callers
    pass new arrays). Like :func:`sgemm`, for calls made with BLAS pinned to one thread (:mod:`.blas`)."""
    jobs = sgemm_stack_jobs(a, b, out, workers)
    if jobs is None:
        return False
    jobs.run(workers)
    return True


def sgemm_stack_jobs(a: np.ndarray, b: np.ndarray, out: np.ndarray, workers: int) -> Jobs | None:
    """The jobs :func:`sgemm_stack` runs (arguments 6, 8 and 10 of each: a's, b's and out's addresses), or None
    where it would refuse."""
    batch = out.shape[:-2]
    if not (a.shape[:-2] == b.shape[:-2] == batch and len(batch) >= 1) or 0 in out.shape[:-2]:
        return None
    rest = list(itertools.product(*map(range, batch[1:])))
    calls = sgemm_calls([(a[(0,) + r], b[(0,) + r], out[(0,) + r]) for r in rest])
    n = batch[0]
    steps = (a.strides[0], b.strides[0], out.strides[0])
    if calls is None or any(_same_buffer(c[6], c[8], steps[0], steps[1], n) for c in calls):
        return None
    lo = np.arange(n, dtype=np.int64) if n <= 64 else np.array([r[0] for r in ranges(n, 8 * workers)], np.int64)
    table = np.empty((len(calls), len(lo), 17), np.int64)
    table[:, :, :15] = np.array([c + steps for c in calls], np.int64)[:, None, :]
    table[:, :, 15] = lo
    table[:, :, 16] = np.append(lo[1:], n)
    jobs = Jobs()
    jobs.rows("sgemm_batch", table.reshape(-1, 17))
    return jobs


def ranges(n: int, parts: int) -> list:
    """[lo, hi) ranges splitting n items into at most ``parts`` nearly equal ones."""
    parts = max(1, min(n, parts))
    return [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]


def _same_buffer(a0: int, b0: int, sa: int, sb: int, n: int) -> bool:
    """Whether a + i * sa == b + i * sb for some item i < n (numpy.matmul runs x @ x^T of one buffer otherwise)."""
    if sa == sb:
        return a0 == b0
    i, r = divmod(b0 - a0, sa - sb)
    return r == 0 and 0 <= i < n


#: cblas enums (no transpose, transpose; the layout, row-major, is csrc/jobs.c's)
_NO_TRANS, _TRANS = 111, 112


def sgemm_calls(views):
    """Per block (x, y, out), the arguments of the ``cblas_sgemm`` call numpy.matmul makes for ``x @ y`` into out
    (numpy's matmul loop: a matrix operand with unit stride along its rows is not transposed, one with unit stride
    down its columns is; lda from the other stride; the output row-major), or None when some block is one numpy
    would run otherwise (not float32, a dimension of 1, an operand or output BLAS cannot take, x and y one buffer),
    or the C jobs or NumPy's ILP64 sgemm are not there."""
    if not sgemm_available():
        return None
    fn = sgemm64_address()
    calls = []
    for x, y, o in views:
        if not (x.dtype == y.dtype == o.dtype == np.float32):
            return None
        (M, K), (_, N) = x.shape, y.shape
        xa, ya = native.address(x), native.address(y)
        if min(M, N, K) <= 1 or xa == ya:
            return None
        fa, fb, fo = _form(x), _form(y), _form(o)
        if fa is None or fb is None or fo is None or fo[0] != _NO_TRANS:
            return None
        calls.append((fn, fa[0], fb[0], M, N, K, xa, fa[1], ya, fb[1], native.address(o), fo[1]))
    return calls


def _form(v: np.ndarray):
    """(trans, leading dimension) of a float32 matrix as numpy's matmul hands it to cblas, or None (not BLAS-able)."""
    s0, s1 = v.strides
    r, c = v.shape
    if s1 == 4 and s0 % 4 == 0 and s0 // 4 >= c:
        return _NO_TRANS, s0 // 4
    if s0 == 4 and s1 % 4 == 0 and s1 // 4 >= r:
        return _TRANS, s1 // 4
    return None
