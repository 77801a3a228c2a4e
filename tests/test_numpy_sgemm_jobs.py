"""Matrix products as C jobs (backends/xconv_numpy/jobs.py, csrc/jobs.c): the colgemm path's column copies and
product blocks, the pointwise forward's per-sample products and jobs.sgemm_stack call the cblas_sgemm numpy.matmul
calls, with numpy's arguments, so their bits are numpy.matmul's on any number of workers. They run on every build
of the compiled loops (AVX-512, AVX2, baseline) where NumPy's BLAS is an ILP64 OpenBLAS."""

import numpy as np
import pytest

import xconv

from xconv.params import make_params
from xconv_numpy import blas, colgemm, jobs, paths, small, small_c

needs_sgemm = pytest.mark.skipif(not jobs.sgemm_available(),
                                 reason="no compiled loops, or NumPy's BLAS here is not an ILP64 OpenBLAS with "
                                        "cblas_sgemm64_ (the sgemm jobs are not used)")


def _bits(arrays):
    return [a.tobytes() for a in arrays]


COLGEMM = [((8, 64, 4, 4), (64, 64, 3, 3), 1, 1), ((2, 32, 2, 5, 5), (48, 32, 3, 3, 3), 1, 1),
           ((8, 3, 32, 32), (16, 3, 7, 7), 2, 3), ((4, 80, 3, 3), (96, 80, 1, 1), 1, 0), ((2, 16, 1, 1), (32, 16, 1, 1), 1, 0),
           ((3, 32, 6, 5), (48, 8, 3, 3), 1, 1, 4)]                   # groups: channel ranges across groups


@needs_sgemm
@pytest.mark.parametrize("case", COLGEMM)
def test_colgemm_blocks_as_c_sgemm_jobs_give_numpy_matmuls_bits(case, monkeypatch):
    """The colgemm path runs its column copies (by channel ranges) and its blocks (the cblas_sgemm calls numpy.matmul
    makes, with numpy's arguments) as one job list, then col2im by channel ranges after dx's blocks: the bits of the
    C loops and numpy.matmul one after the other, on one worker or two, for x in another layout, and for each
    output asked alone."""
    xs, ws, s, pad, g = case + (1,) * (5 - len(case))
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    x_last = np.moveaxis(np.moveaxis(x, 1, -1).copy(), -1, 1)                # channels-last strides, same values
    kw = dict(stride=s, padding=pad, groups=g, backend="numpy")
    runs = {}
    with paths.force("colgemm"):
        for label in ("jobs", "numpy"):
            if label == "numpy":
                monkeypatch.setattr(jobs, "sgemm64_address", lambda: None)      # numpy.matmul per block
            for least in (1 << 62, 0):
                for xx in (x, x_last):
                    with paths.tune(parallel_min_work=least, team_min_work=least), xconv.trace() as tr:
                        y = xconv.conv_fprop(xx, w, **kw)
                        dy = np.linspace(-1, 1, y.size, dtype=np.float32).reshape(y.shape)
                        dx, dw, _ = xconv.convolution_backward(dy, xx, w, output_mask=(True, True, False), **kw)
                        dx1 = xconv.convolution_backward(dy, xx, w, output_mask=(True, False, False), **kw)[0]
                        dw1 = xconv.convolution_backward(dy, xx, w, output_mask=(False, True, False), **kw)[1]
                    assert all(r.path.startswith("colgemm") for r in tr.records), [r.path for r in tr.records]
                    assert _bits((dx1, dw1)) == _bits((dx, dw))
                    runs[(label, least, xx is x)] = _bits((y, dx, dw))
    first = runs[("numpy", 1 << 62, True)]
    assert all(v == first for v in runs.values())


#: colgemm forwards whose products write y's samples themselves (colgemm._direct): 1x1 stride-2 shortcuts, a long
#: 1-D layer, groups, one sample, and a small product whose bits differ from the channel-major route's.
DIRECT = [((2, 64, 56, 56), (128, 64, 1, 1), dict(stride=2)), ((3, 48, 700), (40, 48, 3), dict(stride=2, padding=1)),
          ((4, 32, 24, 24), (48, 8, 3, 3), dict(padding=1, groups=4)), ((1, 16, 30, 30), (24, 16, 1, 1), {}),
          ((2, 64, 10, 10), (16, 64, 1, 1), {})]


@needs_sgemm
@pytest.mark.parametrize("case", DIRECT)
def test_colgemm_forward_into_y_gives_numpy_matmuls_bits_on_its_blocks(case, monkeypatch):
    """Products written straight into y's samples: the bits of numpy.matmul on the same blocks (x's columns from the
    C copies, then per sample the blocks of colgemm._block_views, numpy.matmul into y's rows), with and without a
    bias, on one worker or two; within float32 rounding of the channel-major route (whose blocks span samples: its
    bits may differ, OpenBLAS choosing its kernel by a block's shape)."""
    xs, ws, kw = case
    p = make_params(xs, ws, **kw)
    assert colgemm._direct(p)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    f = small.plan(p)
    cols = small_c.im2col(x, p, f, np.float32)
    want = np.empty(p.output_shape, np.float32)
    ys = want.reshape(f.N, f.g, f.Cog, f.Q)
    wm = w.reshape(f.g, f.Cog, f.Cg * f.K)
    with blas.single_threaded_blas():      # BLAS at one thread, as the paths run it (OpenBLAS's threaded sgemm may
        for n in range(f.N):             # sum in another order: Haswell kernel, Zen 3)
            for a_, b_, o_ in colgemm._block_views(wm, cols[:, :, n * f.Q:(n + 1) * f.Q], ys[n]):
                np.matmul(a_, b_, out=o_)
    with paths.force("colgemm"):
        for least in (1 << 62, 0):
            with paths.tune(parallel_min_work=least, team_min_work=least), xconv.trace() as tr:
                y = xconv.conv_fprop(x, w, backend="numpy", **kw)
                yb = xconv.conv_fprop(x, w, bias=b, backend="numpy", **kw)
            assert all(r.path.startswith("colgemm") for r in tr.records), [r.path for r in tr.records]
            assert y.tobytes() == want.tobytes()
            assert yb.tobytes() == (want + b.reshape((1, -1) + (1,) * (len(xs) - 2))).tobytes()
        monkeypatch.setattr(colgemm, "_direct", lambda q: False)
        channel_major = xconv.conv_fprop(x, w, backend="numpy", **kw)
    np.testing.assert_allclose(y, channel_major, rtol=1e-5, atol=1e-5 * np.abs(channel_major).max())



def test_the_blas_form_of_an_operand_is_numpys():
    a = np.zeros((6, 10), np.float32)
    assert jobs._form(a) == (jobs._NO_TRANS, 10)
    assert jobs._form(a.T) == (jobs._TRANS, 10)
    assert jobs._form(a[:, 2:7]) == (jobs._NO_TRANS, 10)
    assert jobs._form(a[::2]) == (jobs._NO_TRANS, 20)
    assert jobs._form(a[:, ::2]) is None                       # no unit stride: numpy would copy


@needs_sgemm
def test_sgemm_stack_gives_numpy_matmuls_bits_on_batches_of_any_strides():
    """A stack of products as batch jobs (a broadcast operand, a transposed one, two batch dimensions, more items than
    one job each): numpy.matmul's bits on 1 and 2 workers; refused, nothing written, where numpy would not call
    sgemm per matrix (a dimension of 1, float64, x @ x^T of one buffer) or the batches differ."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((3, 24, 40)).astype(np.float32)
    x = rng.standard_normal((70, 3, 17, 40)).astype(np.float32)            # (n, g, P, K): b = x^T, transposed
    stacks = [
        (np.broadcast_to(w, (70, 3, 24, 40)), x.transpose(0, 1, 3, 2)),        # 70 items: ranges of items per job
        (x[:5, 0], w[0].T[None].repeat(5, 0)),                                    # one batch dimension
        (x[::-2, :, :, 1:], np.ascontiguousarray(x[::-2, :, :, :39].transpose(0, 1, 3, 2))),  # negative item stride
    ]
    with blas.single_threaded_blas():
        for a, b in stacks:
            want = np.matmul(a, b)
            for workers in (1, 2):
                got = np.full_like(want, np.nan)
                assert jobs.sgemm_stack(a, b, got, workers)
                assert got.tobytes() == want.tobytes()
        out = np.zeros((4, 17, 17), np.float32)
        refused = [(x[:4, 0], x[:4, 0].transpose(0, 2, 1), out),                  # x @ x^T: numpy's syrk
                   (x[:4, 0, :, :1], x[:4, 0, :1, :], out),                        # inner dimension 1
                   (x[:4, 0].astype(np.float64), x[:4, 0].transpose(0, 2, 1).copy(), out),
                   (x[:3, 0], x[:4, 0].transpose(0, 2, 1).copy(), out)]            # batches differ
        for a, b, o in refused:
            assert not jobs.sgemm_stack(a, b, o, 2)
        assert not out.any()


POINTWISE = [((8, 96, 12, 12), (16, 96, 1, 1), 1), ((4, 32, 7, 5), (64, 16, 1, 1), 2), ((3, 16, 1, 9), (48, 16, 1, 1), 1)]


@needs_sgemm
@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_forward_as_sgemm_jobs_gives_numpy_matmuls_bits(case, monkeypatch):
    xs, ws, g = case
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    runs = {}
    with paths.force("pointwise"):
        for label in ("jobs", "numpy"):
            if label == "numpy":
                monkeypatch.setattr(jobs, "sgemm64_address", lambda: None)
            for least in (1 << 62, 0):
                with paths.tune(parallel_min_work=least, team_min_work=least), xconv.trace() as tr:
                    y = xconv.conv_fprop(x, w, bias=b, groups=g, backend="numpy")
                assert tr.records[0].path.startswith("pointwise")
                runs[(label, least)] = y.tobytes()
    assert len(set(runs.values())) == 1
