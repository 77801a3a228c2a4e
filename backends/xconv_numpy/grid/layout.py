"""Array layouts of the grid paths: channel-grouped views, the weight in scratch layouts, outputs."""

from __future__ import annotations

import numpy as np

from xconv import ConvParams
from xconv.dtypes import DTYPES

from ..aligned import empty_result
from .geometry import Geom, tap_order
from .scratch import Lease


def x4(t, G, C):
    """An (N, G*C, *spatial) tensor viewed as (N, G, C, *spatial)."""
    return t.reshape((t.shape[0], G, C) + t.shape[2:])


def weight_layout(w, geo: Geom, cdt, axes: str, lease: Lease) -> np.ndarray:
    """The weight as a C-contiguous scratch array with axes ``axes``, a permutation of "gock".

    g: group, o: output channel in the group, c: input channel in the group, k: tap, taps in
    phase order. Copied in blocks of output channels so that the strided reads stay in cache
    (a plain transposing copy of a large weight runs at a fraction of memory speed).
    """
    order = tap_order(geo)
    src = w.reshape(geo.g, geo.Cog, geo.Cg, geo.K)            # axes g, o, c, k
    perm = tuple("gock".index(a) for a in axes)
    shape = tuple(src.shape[i] for i in perm)
    permute_taps = order != list(range(geo.K))
    out = lease.empty(shape, cdt)
    tmp = lease.empty(shape, cdt) if permute_taps else out
    block = 32                                          # 32 source rows of C_in/g*K stay in cache
    o_axis = axes.index("o")
    for o in range(0, geo.Cog, block):
        sel = [slice(None)] * 4
        sel[o_axis] = slice(o, o + block)
        tmp[tuple(sel)] = src[:, o:o + block].transpose(perm)
    if permute_taps:                                    # then reorder taps: contiguous rows move
        np.take(tmp, order, axis=axes.index("k"), out=out)
    return out



def new_output(shape, p: ConvParams, zero: bool):
    dt = DTYPES[p.dtype]
    return np.zeros(shape, dt) if zero else empty_result(shape, dt)


def finish_dw(geo: Geom, p: ConvParams, parts):
    """Assemble (kflat indices, array (g, Cog, Cg, J)) parts into (C_out, C_in/g, *k) of the output dtype."""
    dw = np.empty(p.weight_shape, DTYPES[p.dtype])
    view = dw.reshape(geo.g, geo.Cog, geo.Cg, geo.K)
    for kidx, arr in parts:
        if list(kidx) == list(range(geo.K)):
            view[...] = arr
        else:
            view[..., kidx] = arr
    return dw
