"""The NumPy backend's one cache of per-configuration plans (backends/xconv_numpy/plans.py)."""

import numpy as np
import pytest


plans = pytest.importorskip("xconv_numpy.plans")


@pytest.fixture
def fresh():
    plans.clear()
    yield
    plans.clear()


def _configs(n):
    """n distinct hashable stand-ins for ConvParams (the cache only hashes them)."""
    return [("cfg", i) for i in range(n)]


def test_a_cycle_through_more_than_32_configurations_hits_on_the_second_pass(fresh):
    built = []
    plan = plans.per_params(lambda p: built.append(p) or p[1])
    cfgs = _configs(40)                    # MobileNetV2's step has 36: an LRU of 32 rebuilt some every step
    for _ in range(3):
        for p in cfgs:
            assert plan(p) == p[1]
    assert len(built) == 40
    info = plans.cache_info()
    assert (info.misses, info.hits, info.currsize) == (40, 80, 40)


def test_the_count_limit_drops_the_least_recently_used(fresh, monkeypatch):
    monkeypatch.setattr(plans, "MAX_CONFIGS", 3)
    built = []
    plan = plans.per_params(lambda p: built.append(p) or p)
    for p in ["a", "b", "c", "a", "d"]:      # d evicts b (a was used after b)
        plan(p)
    plan("a"), plan("c"), plan("d")
    assert built == ["a", "b", "c", "d"]
    plan("b")
    assert built[-1] == "b"


def test_the_byte_limit_counts_arrays_and_drops_the_oldest(fresh, monkeypatch):
    monkeypatch.setattr(plans, "MAX_BYTES", 3000)
    plan = plans.per_params(lambda p: np.zeros(125, np.float64))      # 1000 bytes each
    for p in range(5):
        plan(p)
    info = plans.cache_info()
    assert info.currsize == 3 and info.bytes == 3000
    plan(0)                                 # dropped: built again
    assert plans.cache_info().misses == 6


def test_one_configuration_larger_than_the_byte_limit_is_still_kept_while_used(fresh, monkeypatch):
    monkeypatch.setattr(plans, "MAX_BYTES", 100)
    plan = plans.per_params(lambda p: np.zeros(1000, np.uint8))
    a = plan("big")
    assert plan("big") is a and plans.cache_info().hits == 1


def test_two_plans_of_one_configuration_live_and_die_together(fresh, monkeypatch):
    monkeypatch.setattr(plans, "MAX_CONFIGS", 1)
    one = plans.per_params(lambda p: ("one", p))
    two = plans.per_params(lambda p: ("two", p))
    assert one("x") == ("one", "x") and two("x") == ("two", "x")
    assert plans.cache_info().currsize == 1
    one("y")
    assert plans.cache_info().currsize == 1 and plans.cache_info().misses == 2
