"""The convolutions as jitted JAX functions, built once per configuration and kept.

One forward function per configuration (:func:`forward`) on ``jax.lax.conv_general_dilated``:

- direct convolution: ``window_strides=stride``, ``rhs_dilation=dilation``, ``padding`` as the
  (low, high) pairs of ``ConvParams`` (asymmetric or not), ``feature_group_count=groups``;
- transposed convolution (PyTorch's ``conv_transpose``): the input dilated by the stride
  (``lhs_dilation=stride``), the weight (C_in, C_out/g, *k) regrouped to (C_out, C_in/g, *k) and
  flipped, padded by ``dilation*(k-1) - pre`` low and ``dilation*(k-1) - post + output_padding``
  high (negative where the padding crops), ``feature_group_count=groups``.

16-bit inputs are widened to float32 inside the function, so products and sums are float32 and
each result is rounded once to the inputs' dtype (xconv's semantics); float32 and float64 are
computed in their own precision, at the ``lax.Precision`` of the math mode.

Gradients come from ``jax.vjp`` of that forward function with respect to only the operands the
mask asks for: for grad_input alone the weight is a constant and no weight gradient is traced,
and a zero placeholder stands for the input that the (linear) gradient never reads; XLA removes
the unused forward convolution. grad_bias is grad_output summed over N and the spatial dims.
"""

from __future__ import annotations

import functools

from .platforms import jax_module


def _accumulation(jnp, dtype: str):
    return jnp.float64 if dtype == "float64" else jnp.float32


def forward(p, precision):
    """f(x, w) -> y in the accumulation dtype (not rounded), for configuration ``p``."""
    jax = jax_module()
    lax, jnp = jax.lax, jax.numpy
    nd = p.nd
    dims = tuple(range(nd + 2))
    numbers = lax.ConvDimensionNumbers(lhs_spec=dims, rhs_spec=dims, out_spec=dims)
    acc = _accumulation(jnp, p.dtype)
    prec = getattr(lax.Precision, precision)

    if not p.transposed:
        def f(x, w):
            return lax.conv_general_dilated(x.astype(acc), w.astype(acc), window_strides=p.stride,
                                            padding=list(p.padding), rhs_dilation=p.dilation,
                                            dimension_numbers=numbers, feature_group_count=p.groups, precision=prec)
        return f

    g = p.groups
    c_in, c_out_g, kernel = p.weight_shape[0], p.weight_shape[1], p.weight_shape[2:]
    pads = [(d * (k - 1) - lo, d * (k - 1) - hi + op)
            for k, d, (lo, hi), op in zip(kernel, p.dilation, p.padding, p.output_padding)]

    def f(x, w):
        w = w.astype(acc).reshape((g, c_in // g, c_out_g) + kernel).swapaxes(1, 2)
        w = jnp.flip(w.reshape((g * c_out_g, c_in // g) + kernel), axis=tuple(range(2, nd + 2)))
        return lax.conv_general_dilated(x.astype(acc), w, window_strides=(1,) * nd, padding=pads,
                                        lhs_dilation=p.stride, rhs_dilation=p.dilation, dimension_numbers=numbers,
                                        feature_group_count=g, precision=prec)
    return f


@functools.lru_cache(maxsize=256)
def fprop_fn(p, precision: str, with_bias: bool):
    """jit(x, w[, bias]) -> y of dtype p.dtype."""
    jax = jax_module()
    jnp = jax.numpy
    f = forward(p, precision)
    out = jnp.dtype(p.dtype)
    bias_shape = (1, -1) + (1,) * p.nd

    if with_bias:
        return jax.jit(lambda x, w, b: (f(x, w) + b.astype(_accumulation(jnp, p.dtype)).reshape(bias_shape)).astype(out))
    return jax.jit(lambda x, w: f(x, w).astype(out))


@functools.lru_cache(maxsize=256)
def backward_fn(p, precision: str, mask: tuple):
    """jit(dy, *operands) -> the masked gradients (a tuple in mask order, masked ones left out).

    ``operands`` are what the asked gradients read: the weight for grad_input, the input for
    grad_weight (both for both); none for grad_bias alone.
    """
    jax = jax_module()
    jnp = jax.numpy
    f = forward(p, precision)
    acc = _accumulation(jnp, p.dtype)
    out = jnp.dtype(p.dtype)
    want_x, want_w, want_b = mask
    reduce_axes = (0,) + tuple(range(2, p.nd + 2))

    def run(dy, *operands):
        results = []
        dy_acc = dy.astype(acc)
        if want_x and want_w:
            x, w = operands
            _, pullback = jax.vjp(f, x, w)
            dx, dw = pullback(dy_acc)
            results += [dx.astype(out), dw.astype(out)]
        elif want_x:
            (w,) = operands
            x0 = jnp.zeros(p.input_shape, out)             # never read: the gradient is linear in dy
            _, pullback = jax.vjp(lambda x: f(x, w), x0)
            results.append(pullback(dy_acc)[0].astype(out))
        elif want_w:
            (x,) = operands
            w0 = jnp.zeros(p.weight_shape, out)
            _, pullback = jax.vjp(lambda w: f(x, w), w0)
            results.append(pullback(dy_acc)[0].astype(out))
        if want_b:
            results.append(dy_acc.sum(axis=reduce_axes).astype(out))
        return tuple(results)

    return jax.jit(run)



def cache_key(p):
    """``p`` with what a compiled function does not depend on reset (math and determinism enter through
    ``precision``), so that calls differing only there share one compiled function."""
    return p.replace(math="keep_dtype", deterministic=False, workspace_limit=None)
