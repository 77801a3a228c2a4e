"""The pointwise path's float32 calls from job tables kept per configuration (no Python per chunk or product).

The forward and the backward of :mod:`.pointwise` as C sgemm jobs (:mod:`..jobs`): each product the
``cblas_sgemm`` call numpy.matmul makes for it in :func:`.pointwise.fprop` / :func:`.pointwise.backward`, and dW's
per-sample products summed in their order (:func:`.pointwise.backward_chunks`), so the bits are those paths'. The job
table is built once per configuration, worker count and mask (a :class:`..jobs.Template`: offsets from the call's
arrays) and run on torch's OpenMP team where it is loaded. Taken (:func:`takes`) for float32 calls of at most
MAX_JOBS jobs whose operands are C-contiguous and do not overlap; the backward also without a workspace limit and with
dW's per-sample products within their bound (the forward needs no scratch). Otherwise (None) the chunked paths run.
"""

from __future__ import annotations

import numpy as np

from xconv import tracing

from .. import jobs, native
from ..aligned import empty_result
from ..plans import per_params
from .geometry import geom
from .pointwise import backward_chunks, dw_dy_rows
from .scratch import slot_order_sum


#: Most jobs of one output's table (a job per sample, up to 64, and group): the tables kept per configuration stay
#: small (the chunked path serves calls of more, e.g. a 1x1 in 8 groups of 64 samples).
MAX_JOBS = 256
#: dW's per-sample products (N x the weights' elements) are kept up to this many elements, or up to half the call's x
#: and dy elements (the chunked path sums them chunk by chunk within its budget: a 128x512x14x14 -> 512 backward would
#: keep 129 MiB here against the chunks' 39).
PER_SAMPLE_ELEMENTS = 1 << 20


@per_params
def takes(p) -> tuple:
    """(forward and dx, dW): whether this module serves them for ``p``, from its shapes alone (float32, its tables
    within MAX_JOBS, dW's per-sample products within their bound, no workspace limit: the chunked path leases and
    keeps to one); a call is still refused where its arrays are not C-contiguous float32 or overlap."""
    geo = geom(p)
    small = p.dtype == "float32" and geo.g * min(geo.N, 64) <= MAX_JOBS
    per, io = geo.N * geo.g * geo.Cog * geo.Cg, geo.N * geo.g * geo.P * (geo.Cg + geo.Cog)
    return small, small and p.workspace_limit is None and per <= max(PER_SAMPLE_ELEMENTS, io // 2)


def builds_forward(p) -> bool:
    """Whether the forward's sgemm table can be built for ``p`` (:func:`takes`, NumPy's ILP64 sgemm found, and no
    product with a dimension of 1, which :func:`..jobs.sgemm_calls` refuses: 8x256x1x1 -> 64, a 1-channel head or
    input, take the chunked path instead); a call may still be refused by its arrays' layout."""
    geo = geom(p)
    return takes(p)[0] and jobs.sgemm_available() and min(geo.Cg, geo.Cog, geo.P) > 1


@per_params
def _templates(p) -> dict:
    """{(op, workers, mask): jobs.Template or None (the sgemm jobs refused)} of configuration ``p``."""
    return {}


_F32 = np.dtype(np.float32)


def _plain(*arrays) -> bool:
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def _apart(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays' buffers do not overlap (numpy.matmul runs a product of one buffer otherwise)."""
    pa, pb = native.address(a), native.address(b)
    return pa + a.nbytes <= pb or pb + b.nbytes <= pa


def fprop(p, x, w, bias, workers: int):
    """y as :func:`.pointwise.fprop` computes it (the same sgemm calls), or None (see the module docstring); the
    trace record's scratch: none (the products write y in place)."""
    y = fprop_runner(p)(x, w, bias, workers)
    if y is not None:
        tracing.workspace(0)
    return y


@per_params
def fprop_runner(p):
    """:func:`fprop` of ``p`` as ``run(x, w, bias, workers)``, what depends on ``p`` alone looked up once (a lane's
    runner keeps it)."""
    if not takes(p)[0]:
        return lambda x, w, bias, workers: None
    geo = geom(p)
    g, Cg, Cog, P, N = geo.g, geo.Cg, geo.Cog, geo.P, geo.N
    templates, out_shape = _templates(p), tuple(p.output_shape)

    def run(x, w, bias, workers: int):
        if not (x.dtype == _F32 and w.dtype == _F32 and x.flags.c_contiguous and w.flags.c_contiguous   # _plain,
                and _apart(x, w)):                                                                     # in line
            return None
        y = empty_result(out_shape, np.float32)
        key = ("y", workers)
        bases = (w, x, y)
        template = templates.get(key, False)
        if template is False:
            made = jobs.sgemm_stack_jobs(np.broadcast_to(w.reshape(g, Cog, Cg), (N, g, Cog, Cg)),
                                         x.reshape(N, g, Cg, P), y.reshape(N, g, Cog, P), workers)
            template = templates[key] = None if made is None else made.template({6: 0, 8: 1, 10: 2}, bases)
        if template is None:
            return None
        jobs._execute_template(template, bases, workers, 0)          # template.run(bases, workers)
        if bias is not None:
            y.reshape(N, g, Cog, P)[...] += np.asarray(bias, np.float32).reshape(1, g, Cog, 1)
        return y
    return run


def backward(p, dy, x, w, need_dx: bool, need_dw: bool, workers: int):
    """(dx, dw) as :func:`.pointwise.backward` computes them (None where not needed), or None (see the module
    docstring): dx[n] = W^T @ dy[n] and dW's per-sample products as one list of sgemm jobs, then dW's sums in the
    chunked path's order."""
    return backward_runner(p)(dy, x, w, need_dx, need_dw, workers)


@per_params
def backward_runner(p):
    """:func:`backward` of ``p`` as ``run(dy, x, w, need_dx, need_dw, workers)`` (see :func:`fprop_runner`)."""
    geo = geom(p)
    g, Cg, Cog, P, N = geo.g, geo.Cg, geo.Cog, geo.P, geo.N
    serves, dy_rows, templates = takes(p), dw_dy_rows(geo), _templates(p)
    if p.workspace_limit is not None or not serves[0]:
        return lambda dy, x, w, need_dx, need_dw, workers: None

    def run(dy, x, w, need_dx: bool, need_dw: bool, workers: int):
        if not _plain(dy, *([w] if need_dx else []), *([x] if need_dw else [])):
            return None
        if need_dw and not (serves[1] and _apart(x, dy)):
            return None                    # dW's per-sample products past their bound: the chunks keep to it
        dx = empty_result(p.input_shape, np.float32) if need_dx else None
        wt = np.ascontiguousarray(w.reshape(g, Cog, Cg).transpose(0, 2, 1)) if need_dx else None     # (g, Cg, Cog)
        per = np.empty((N, g) + ((Cog, Cg) if dy_rows else (Cg, Cog)), np.float32) if need_dw else None
        bases = (wt, dy, x, dx, per)
        key = ("backward", workers, need_dx, need_dw)
        template = templates.get(key, False)
        if template is False:
            template = templates[key] = _backward_template(geo, dy.reshape(N, g, Cog, P), x, wt, dx, per, dy_rows,
                                                           workers, bases)
        if template is None:
            return None
        template.run(bases, workers)
        tracing.workspace((wt.nbytes if need_dx else 0) + (per.nbytes if need_dw else 0))
        dw = None
        if need_dw:
            chunks, slots, _, _ = backward_chunks(geo)       # pointwise.backward's sums: per chunk, then as its slots
            total = slot_order_sum((np.sum(per[n0:n1], axis=0) for n0, n1 in chunks), slots)
            dw = np.empty(p.weight_shape, np.float32)
            dw.reshape(g, Cog, Cg)[...] = total if dy_rows else total.transpose(0, 2, 1)
        return dx, dw
    return run


def _backward_template(geo, dy4, x, wt, dx, per, dy_rows: bool, workers: int, bases):
    """The sgemm jobs of dx and dW's per-sample products as one template on (wt, dy, x, dx, per), or None."""
    g, Cg, Cog, P, N = geo.g, geo.Cg, geo.Cog, geo.P, geo.N
    parts = []
    if dx is not None:
        made = jobs.sgemm_stack_jobs(np.broadcast_to(wt, (N, g, Cg, Cog)), dy4, dx.reshape(N, g, Cg, P), workers)
        if made is None:
            return None
        parts.append((made, {6: 0, 8: 1, 10: 3}))
    if per is not None:
        x4 = x.reshape(N, g, Cg, P)
        a, b = (dy4, x4.transpose(0, 1, 3, 2)) if dy_rows else (x4, dy4.transpose(0, 1, 3, 2))
        made = jobs.sgemm_stack_jobs(a, b, per, workers)
        if made is None:
            return None
        parts.append((made, {6: 1, 8: 2, 10: 4} if dy_rows else {6: 2, 8: 1, 10: 4}))
    return jobs.Template.joined(parts, bases)
