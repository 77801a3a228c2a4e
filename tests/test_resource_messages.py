"""ResourceError messages say what the bytes are for and never name the wrong backend (issue 26)."""
import numpy as np
import pytest

import xconv


def test_converted_copies_of_broadcast_big_endian_inputs_are_named(monkeypatch):
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "1MiB")
    x = np.broadcast_to(np.ones((1, 1, 1, 1), ">f4"), (8, 1, 512, 512))       # 8 MiB once made contiguous
    w = np.ones((1, 1, 512, 512), np.float32)
    with pytest.raises(xconv.ResourceError) as e:
        xconv.conv_fprop(x, w, backend="numpy")
    assert "converted copies of the inputs" in str(e.value), str(e.value)


def test_numpy_exact_refusal_does_not_say_numpy(monkeypatch):
    monkeypatch.setenv("XCONV_MEMORY_LIMIT", "200KiB")
    x = np.ones((1, 8, 64, 64), np.float32)
    w = np.ones((8, 8, 3, 3), np.float32)
    with pytest.raises(xconv.ResourceError) as e:
        xconv.conv_fprop(x, w, padding=1, backend="numpy-exact")
    assert "im2col" in str(e.value) and "numpy fprop" not in str(e.value), str(e.value)   # the reference's own refusal
