"""Bitwise digests of the NumPy backends over a fixed set of calls: the before/after check of a refactoring.

Usage (run it against two trees, each first on PYTHONPATH, and compare the files)::

    python tests/numpy_digests.py OUT.json [--backends numpy,numpy-exact] [--random 240]

The calls: every valid case of the conformance corpus (``convolution_backward``, as the kit calls it), and a
seeded random set of configurations covering fprop, dgrad, wgrad, backward (every output mask) and the bias
gradient; 1-, 2- and 3-D; transposed; groups and depthwise; strides, dilations, paddings; float16, bfloat16,
float32 and float64; deterministic levels; workspace limits (a refusal is recorded by its error class); inputs
with a NaN or an infinity; and a few larger calls whose samples the dense loops take in blocks (``BLOCKED``, the
NumPy fast path only). Per (call, output) the sha256 of dtype, shape and bytes (runner.digest).

The bits depend on the build: the compiled loops' instruction set (``native`` picks the best the CPU runs) and
the BLAS kernel numpy calls (OpenBLAS picks one per CPU; ``OPENBLAS_CORETYPE`` overrides it). :func:`build_key`
names both; a stored manifest is only comparable under the same key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import xconv
from xconv_conformance.cases import load_corpus, make_inputs
from xconv_conformance.runner import call_kwargs, digest


def build_key() -> str:
    """What the bits depend on besides the code: numpy's version, the compiled loops' build, the BLAS kernel."""
    try:
        from xconv_numpy import native
        isa = native.isa(native.load())
    except Exception as e:  # noqa: BLE001 - no build: the NumPy paths only
        isa = f"none ({type(e).__name__})"
    try:
        import threadpoolctl
        infos = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
        ours = [i for i in infos if "numpy" in str(i.get("filepath", ""))] or infos     # numpy's, not torch's
        blas = ",".join(sorted({f"{i.get('internal_api')}-{i.get('architecture')}" for i in ours}))
    except ImportError:
        blas = "unknown (no threadpoolctl)"
    return f"numpy {np.__version__}; loops {isa}; blas {blas}"


def _result(fn):
    try:
        out = fn()
    except xconv.XconvError as e:
        return ["raised " + type(e).__name__]
    if not isinstance(out, tuple):
        out = (out,)
    return [digest(a) for a in out]


def corpus_calls():
    """(name, thunk(backend)) for every valid corpus case."""
    for case in load_corpus():
        if case.kind != "valid":
            continue

        def run(backend, case=case):
            inp = make_inputs(case)
            return _result(lambda: xconv.convolution_backward(inp.grad_output, inp.input, inp.weight,
                                                              backend=backend, **call_kwargs(case)))
        yield "corpus/" + case.id, run


DTYPES = ("float32", "float32", "float64", "float16", "bfloat16")


def _values(rng, shape, dtype):
    from xconv.dtypes import DTYPES as NP
    return rng.standard_normal(shape).astype(np.float32).astype(NP[dtype])


def random_configs(n: int, seed: int = 23):
    """n configurations drawn from a fixed seed (the same list on any machine)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        nd = int(rng.choice([1, 2, 2, 2, 3]))
        size = int(rng.choice([0, 1, 1, 2]))             # 0 tiny, 1 small, 2 grid-sized
        kind = rng.choice(["dense", "dense", "depthwise", "grouped", "wide16", "stem"])
        g = 1
        if kind == "depthwise":
            g = int(rng.choice([3, 8, 16]))
            cin, cout = g, g * int(rng.choice([1, 1, 2, 8]))
        elif kind == "grouped":
            g = int(rng.choice([2, 4]))
            cin, cout = g * int(rng.integers(1, 9)), g * int(rng.integers(1, 9))
        elif kind == "wide16":
            cin, cout = 16 * int(rng.integers(1, 4)), 16 * int(rng.integers(1, 4))
        elif kind == "stem":
            cin, cout = 3, int(rng.choice([16, 32]))
        else:
            cin, cout = int(rng.integers(1, 12)), int(rng.integers(1, 12))
        base = {0: (2, 6), 1: (4, 12), 2: (10, 28)}[size]
        if nd == 3:
            base = (base[0], max(3, base[1] // 2))
        spatial = tuple(int(rng.integers(*base)) for _ in range(nd))
        kernel = tuple(int(rng.choice([1, 1, 2, 3, 3, 5])) for _ in range(nd))
        stride = tuple(int(rng.choice([1, 1, 1, 2, 3])) for _ in range(nd))
        dilation = tuple(int(rng.choice([1, 1, 1, 2])) for _ in range(nd))
        padding = tuple(int(rng.integers(0, 3)) for _ in range(nd))
        transposed = bool(rng.random() < 0.15)
        N = int(rng.choice([1, 2, 3, 4] if size < 2 else [2, 4, 8]))
        cfg = dict(nd=nd, N=N, cin=cin, cout=cout, groups=g, spatial=spatial, kernel=kernel, stride=stride,
                   dilation=dilation, padding=padding, transposed=transposed,
                   output_padding=tuple(int(rng.integers(0, s)) if transposed else 0 for s in stride),
                   dtype=str(rng.choice(DTYPES)),
                   deterministic=[False, True, "batch_invariant"][int(rng.choice([0, 0, 1, 2]))],
                   workspace_limit=[None, None, None, 1 << 12, 1 << 16, 1 << 20, 1 << 24][int(rng.integers(7))],
                   nonfinite=[None, None, None, None, "nan", "inf"][int(rng.integers(6))],
                   nonfinite_in=str(rng.choice(["dy", "x", "w"])), seed=i)
        out.append(cfg)
    return out


def describe(seed: int, n: int = 400) -> str:
    """The random configuration ``seed`` in words."""
    return "{nd}d N{N} {cin}->{cout} g{groups} S{spatial} k{kernel} s{stride} d{dilation} p{padding} " \
        "t{transposed} op{output_padding} {dtype} det={deterministic} ws={workspace_limit} " \
        "nf={nonfinite} in {nonfinite_in}".format(**random_configs(n)[seed])


def _conv_kw(c):
    return dict(stride=c["stride"], padding=c["padding"], dilation=c["dilation"], groups=c["groups"],
                transposed=c["transposed"], output_padding=c["output_padding"], deterministic=c["deterministic"],
                workspace_limit=c["workspace_limit"])


def random_calls(n: int):
    for c in random_configs(n):
        if c["transposed"]:
            xshape = (c["N"], c["cout"]) + c["spatial"]
            wshape = (c["cout"], c["cin"] // c["groups"]) + c["kernel"]
        else:
            xshape = (c["N"], c["cin"]) + c["spatial"]
            wshape = (c["cout"], c["cin"] // c["groups"]) + c["kernel"]
        kw = _conv_kw(c)
        try:
            yshape = xconv.output_shape(xshape, wshape, **{k: kw[k] for k in ("stride", "padding", "dilation",
                                                                               "groups", "transposed",
                                                                               "output_padding")})
        except xconv.XconvError:
            continue
        if min(yshape) <= 0:
            continue
        name = f"random/{c['seed']}"                 # describe(seed) spells the configuration out

        def inputs(c=c, xshape=xshape, wshape=wshape, yshape=yshape):
            rng = np.random.default_rng(1000 + c["seed"])
            x, w, dy = (_values(rng, s, c["dtype"]) for s in (xshape, wshape, yshape))
            if c["nonfinite"]:
                t = {"dy": dy, "x": x, "w": w}[c["nonfinite_in"]]
                t.reshape(-1)[int(rng.integers(t.size))] = np.nan if c["nonfinite"] == "nan" else np.inf
            b = _values(rng, (c["cout"] if not c["transposed"] else c["cin"],), c["dtype"])
            return x, w, dy, b

        def fprop(backend, c=c, kw=kw, inputs=inputs):
            x, w, _, b = inputs()
            return _result(lambda: xconv.conv_fprop(x, w, bias=b, backend=backend, **kw))

        def dgrad(backend, kw=kw, inputs=inputs, xshape=xshape):
            _, w, dy, _ = inputs()
            return _result(lambda: xconv.conv_dgrad(dy, w, xshape, backend=backend, **kw))

        def wgrad(backend, kw=kw, inputs=inputs, wshape=wshape):
            x, _, dy, _ = inputs()
            return _result(lambda: xconv.conv_wgrad(x, dy, wshape, backend=backend, **kw))

        yield name + "/fprop", fprop
        yield name + "/dgrad", dgrad
        yield name + "/wgrad", wgrad
        for mask in ((True, True, True), (True, False, False), (False, True, False), (False, False, True),
                     (True, True, False), (False, True, True)):
            def back(backend, kw=kw, inputs=inputs, mask=mask):
                x, w, dy, _ = inputs()
                return _result(lambda: xconv.convolution_backward(dy, x, w, bias_sizes=[dy.shape[1]],
                                                                  output_mask=mask, backend=backend, **kw))
            yield name + "/backward" + "".join("1" if m else "0" for m in mask), back


#: Calls whose samples the dense loops take in several blocks (their weight gradient adds the blocks in order: its
#: bits follow the blocks), on the NumPy fast path only: (x shape, weight shape, padding, dilation, dtype).
BLOCKED = (((32, 64, 14, 14), (128, 64, 3, 3), 1, 1, "float32"), ((16, 128, 7, 7), (128, 128, 3, 3), 2, 2, "float32"))


def blocked_calls():
    """(name, thunk(backend)) for BLOCKED: the weight gradient alone and the full backward."""
    for i, (xs, ws, pad, dil, dtype) in enumerate(BLOCKED):
        def inputs(i=i, xs=xs, ws=ws, pad=pad, dil=dil, dtype=dtype):
            rng = np.random.default_rng(5000 + i)
            ys = xconv.output_shape(xs, ws, padding=pad, dilation=dil)
            return tuple(_values(rng, s, dtype) for s in (xs, ws, ys))

        for mask in ((False, True, False), (True, True, True)):
            def back(backend, inputs=inputs, mask=mask, pad=pad, dil=dil):
                x, w, dy = inputs()
                return _result(lambda: xconv.convolution_backward(dy, x, w, bias_sizes=[dy.shape[1]], padding=pad,
                                                                  dilation=dil, output_mask=mask, backend=backend))
            yield f"blocked/{i}/backward" + "".join("1" if m else "0" for m in mask), back


def compute(backends=("numpy", "numpy-exact"), n_random: int = 400, corpus: bool = True) -> dict:
    calls = list(corpus_calls()) if corpus else []
    calls += list(random_calls(n_random))
    blocked = list(blocked_calls())
    digests = {}
    with np.errstate(all="ignore"):
        for backend in backends:
            for name, run in calls + (blocked if backend == "numpy" else []):
                try:
                    digests[f"{backend}|{name}"] = run(backend)
                except Exception as e:  # noqa: BLE001 - recorded: a raw exception is a finding too
                    digests[f"{backend}|{name}"] = [f"raw {type(e).__name__}: {e}"]
    return {"build": build_key(), "digests": digests}


def compact(result: dict) -> dict:
    """The committed form: per call the first 16 hex digits of the sha256 of its outputs' digests."""
    import hashlib
    return {k: hashlib.sha256("|".join(str(d) for d in v).encode()).hexdigest()[:16]
            for k, v in result["digests"].items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--backends", default="numpy,numpy-exact")
    ap.add_argument("--random", type=int, default=400)
    ap.add_argument("--manifest", help="also add this build's compact digests to this manifest file")
    a = ap.parse_args(argv)
    from xconv_numpy import paths
    with paths.without_cost_model():       # as test_numpy_digests checks them: the table's rules, not the cost model
        result = compute(tuple(a.backends.split(",")), a.random)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=0, sort_keys=True)
    if a.manifest:
        try:
            with open(a.manifest) as f:
                manifest = json.load(f)
        except FileNotFoundError:
            manifest = {}
        manifest.setdefault("builds", {})[result["build"]] = compact(result)
        with open(a.manifest, "w") as f:
            json.dump(manifest, f, indent=0, sort_keys=True)
    n = sum(len(v) for v in result["digests"].values())
    print(f"{len(result['digests'])} calls, {n} outputs; build: {result['build']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
