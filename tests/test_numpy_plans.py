"""The NumPy backend's one cache of per-configuration plans (backends/xconv_numpy/plans.py)."""

import gc

import numpy as np
import pytest

plans = pytest.importorskip("xconv_numpy.plans")


@pytest.fixture
def fresh():
    plans.clear()
    yield
    plans.clear()


def test_a_cycle_through_more_than_32_configurations_hits_on_the_second_pass(fresh):
    built = []
    plan = plans.per_params(lambda p: built.append(p) or p[1])
    cfgs = [("cfg", i) for i in range(40)]  # MobileNetV2's step has 36: an LRU of 32 rebuilt some every step
    for _ in range(3):
        for p in cfgs:
            assert plan(p) == p[1]
    assert len(built) == 40
    info = plans.cache_info()
    assert (info.misses, info.hits, info.currsize) == (40, 80, 40)


def test_the_count_limit_drops_the_least_recently_used(fresh):
    built = []
    plan = plans.per_params(lambda p: built.append(p) or p)
    plan("first")
    for i in range(plans.MAX_CONFIGS - 1):
        plan(i)
    plan("first")                                  # used again: the oldest is now 0
    plan("new")                                    # one past the limit: 0 is dropped
    plan("first")
    assert built.count("first") == 1
    plan(0)
    assert built.count(0) == 2 and plans.cache_info().currsize == plans.MAX_CONFIGS


def test_the_byte_limit_drops_the_others_and_keeps_the_configuration_being_planned(fresh, monkeypatch):
    monkeypatch.setattr(plans, "MAX_BYTES", 3000)
    built = []
    plan = plans.per_params(lambda p: built.append(p) or np.zeros(125, np.float64))      # 1000 bytes each
    for p in range(3):
        plan(p)
    assert plans.live_bytes() == 3000 and plans.cache_info().currsize == 3
    plan(3)                                        # 4000 bytes: the others dropped
    gc.collect()
    assert plans.cache_info().currsize == 1 and plans.live_bytes() == 1000
    plan(3)
    assert built == [0, 1, 2, 3]
    plan(0)
    assert built == [0, 1, 2, 3, 0]


def test_one_configuration_larger_than_the_byte_limit_is_still_kept_while_used(fresh, monkeypatch):
    monkeypatch.setattr(plans, "MAX_BYTES", 100)
    built = []
    plan = plans.per_params(lambda p: built.append(p) or np.zeros(1000, np.uint8))
    a = plan("big")
    assert plan("big") is a and built == ["big"]


def test_arrays_in_tuples_and_attributes_are_counted(fresh):
    class Tables:
        def __init__(self):
            self.rows = (np.zeros(10, np.int64), np.zeros(5, np.int64))
            self.reg = np.zeros(3, np.int64)

    plans.per_params(lambda p: Tables())("t")
    assert plans.live_bytes() == 8 * 18


def test_two_plans_of_one_configuration_live_and_die_together(fresh):
    one = plans.per_params(lambda p: ("one", p))
    two = plans.per_params(lambda p: ("two", p))
    assert one("x") == ("one", "x") and two("x") == ("two", "x")
    assert plans.cache_info().currsize == 1
    plans.clear()
    gc.collect()
    assert plans.cache_info().currsize == 0 and plans.live_bytes() == 0
