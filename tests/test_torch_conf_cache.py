"""The per-call work the converted modules keep between calls (issue 25): each module's normalized convolution
(``_XConvMixin._conf``) and the plan cache's keys of repeated parameter tuples. Whatever is changed between two calls
(an attribute, the weight, the dtype, the input's shape) gives the changed convolution's results, and a bad value set
on a module that already ran is refused as on a fresh one."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from core_helpers import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import xconv  # noqa: E402
import xconv.torch as xt  # noqa: E402
from xconv import plan_cache  # noqa: E402
from xconv.errors import ShapeError  # noqa: E402


def _pair(seed=0, **kwargs):
    torch.manual_seed(seed)
    module = nn.Conv2d(4, 6, 3, **kwargs).double()
    return module, xt.convert(copy.deepcopy(module), backend="numpy")


def _same(module, xmod, x):
    torch.testing.assert_close(xmod(x), module(x), rtol=1e-10, atol=1e-10)


def test_changed_attributes_give_the_changed_convolution():
    module, xmod = _pair(padding=1)
    x = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    _same(module, xmod, x)
    for name, value in [("padding", (2, 0)), ("stride", (2, 1)), ("dilation", (2, 2)), ("padding", (0, 1))]:
        setattr(module, name, value)
        setattr(xmod, name, value)
        _same(module, xmod, x)
    xmod.padding = [1, 1]                    # a list, then the same list changed in place
    module.padding = (1, 1)
    _same(module, xmod, x)
    xmod.padding[0] = 2
    module.padding = (2, 1)
    _same(module, xmod, x)


def test_string_padding_follows_the_reversed_pads():
    """A padding string is read through torch's ``_reversed_padding_repeated_twice`` (a list): changed in place, the
    module computes what a module that never ran computes."""
    module, xmod = _pair(padding="same", dilation=2)
    x = torch.randn(1, 4, 7, 7, dtype=torch.float64)
    _same(module, xmod, x)
    xmod._reversed_padding_repeated_twice[:] = [2, 2, 0, 0]
    fresh = copy.deepcopy(xmod)
    assert fresh.__dict__.get("_xconv_conf") is None
    assert xmod(x).shape == (1, 6, 3, 7)
    assert torch.equal(xmod(x), fresh(x))


def test_replaced_weight_dtype_and_input_shape():
    module, xmod = _pair(padding=1)
    x = torch.randn(2, 4, 6, 6, dtype=torch.float64)
    _same(module, xmod, x)
    with torch.no_grad():
        new = torch.randn_like(module.weight)
        module.weight.copy_(new)             # in place
        xmod.weight.copy_(new)
    _same(module, xmod, x)
    module.weight = nn.Parameter(torch.randn_like(module.weight))   # a new Parameter
    xmod.weight = nn.Parameter(module.weight.detach().clone())
    _same(module, xmod, x)
    _same(module, xmod, torch.randn(3, 4, 11, 5, dtype=torch.float64))      # another shape
    _same(module, xmod, torch.randn(4, 5, 5, dtype=torch.float64))          # unbatched
    module.float(), xmod.float()
    torch.testing.assert_close(xmod(x.float()), module(x.float()), rtol=1e-5, atol=1e-5)   # another dtype
    with pytest.raises(ShapeError, match="channels"):
        xmod(torch.randn(1, 3, 6, 6))


@pytest.mark.parametrize("name, value, message", [("deterministic", 0, "deterministic"),
                                                  ("deterministic", "always", "deterministic"),
                                                  ("math", "fast", "math"), ("groups", 3, "groups")])
def test_bad_values_set_after_a_call_are_refused(name, value, message):
    _, xmod = _pair(padding=1)
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    xmod(x)
    setattr(xmod, name, value)
    with pytest.raises(ShapeError, match=message):
        xmod(x)


def test_deterministic_changed_to_an_equal_value_of_another_type():
    """True then np.True_ (accepted as a bool) then 1 (refused): the cache compares objects, not values."""
    module, xmod = _pair(padding=1)
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    xmod.deterministic = True
    _same(module, xmod, x)
    xmod.deterministic = np.True_
    _same(module, xmod, x)
    xmod.deterministic = 1
    with pytest.raises(ShapeError, match="deterministic"):
        xmod(x)


def test_copies_and_pickles_make_their_own():
    module, xmod = _pair(padding=1)
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    _same(module, xmod, x)
    assert xmod.__dict__.get("_xconv_conf") is not None
    for other in (copy.deepcopy(xmod), pickle.loads(pickle.dumps(xmod))):
        assert other.__dict__.get("_xconv_conf") is None
        _same(module, other, x)


def test_transposed_output_size_per_call():
    torch.manual_seed(3)
    module = nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1).double()
    xmod = xt.convert(copy.deepcopy(module), backend="numpy")
    x = torch.randn(1, 4, 5, 5, dtype=torch.float64)
    for size in (None, (10, 10), (9, 10), None):
        torch.testing.assert_close(xmod(x, output_size=size), module(x, output_size=size), rtol=1e-10, atol=1e-10)


def test_plan_keys_of_one_tuple_object_tell_types_apart():
    """The plan cache keeps the key of a tuple it saw by identity; tuples equal in value but of other entry types
    (True for 1) still get their own key, and a bad one is refused on every call."""
    one, flags = (1, 1), (True, 1)
    assert one == flags and plan_cache._value_key(one) != plan_cache._value_key(flags)
    assert plan_cache._value_key(one) == plan_cache._value_key(one)
    assert plan_cache._value_key(((1, 1), (1, 1))) != plan_cache._value_key(((1, 1), (True, 1)))
    x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    assert xconv.conv_fprop(x, w, stride=one).shape == (1, 3, 3, 3)
    for _ in range(2):
        with pytest.raises(ShapeError, match="stride"):
            xconv.conv_fprop(x, w, stride=flags)
    assert xconv.conv_fprop(x, w, stride=one).shape == (1, 3, 3, 3)
    mutable = [(1, 1), (0, 0)]                        # a list: its key is never kept (it may change in place)
    assert xconv.conv_fprop(x, w, padding=mutable).shape == (1, 3, 5, 3)
    mutable[0] = (True, 1)
    with pytest.raises(ShapeError, match="padding"):
        xconv.conv_fprop(x, w, padding=mutable)
