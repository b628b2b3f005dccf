"""planner.fastdc.frozen behaves as ``dataclass(frozen=True)``: compared field by field
with a class made by the standard library from the same definition."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from planner.fastdc import frozen
from planner.protocol import RunStage


def _define(decorate):
    @decorate
    class Rec:
        device: str
        lap_id: int
        inputs: tuple = ()
        note: str | None = None
    return Rec


Fast, Ref = _define(frozen), _define(dataclasses.dataclass(frozen=True))


@pytest.mark.parametrize("args,kwargs", [(("g1", 3), {}), (("g1", 3, (1, 2)), {}), (("g1",), {"lap_id": 4, "note": "x"}),
                                         ((), {"device": "d", "lap_id": 0, "inputs": (5,)})])
def test_same_fields_repr_equality_and_hash_as_the_standard_frozen_dataclass(args, kwargs):
    a, b = Fast(*args, **kwargs), Ref(*args, **kwargs)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert repr(a).replace("Rec", "") == repr(b).replace("Rec", "")
    assert a == Fast(*args, **kwargs) and hash(a) == hash(Fast(*args, **kwargs))
    assert [f.name for f in dataclasses.fields(a)] == ["device", "lap_id", "inputs", "note"]


def test_fast_init_is_used_and_still_frozen_replace_and_pickle_work():
    assert "__dict__" in Fast.__init__.__code__.co_names  # the fast __init__, not dataclasses'
    a = Fast("g1", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.lap_id = 4
    assert dataclasses.replace(a, lap_id=9) == Fast("g1", 9)
    rs = RunStage("g1", 3, 0, 16, 4, (1, 2, 3, 4))  # a protocol class made with frozen
    assert pickle.loads(pickle.dumps(rs)) == rs
    with pytest.raises(TypeError):
        Fast("g1")  # lap_id has no default
    with pytest.raises(TypeError):
        Fast("g1", 1, (), None, "extra")


def test_a_class_with_post_init_or_a_factory_keeps_the_standard_init():
    @frozen
    class Checked:
        x: int

        def __post_init__(self):
            if self.x < 0:
                raise ValueError("x < 0")

    @frozen
    class Listed:
        xs: tuple = dataclasses.field(default_factory=tuple)

    with pytest.raises(ValueError):
        Checked(-1)
    assert "__dict__" not in Checked.__init__.__code__.co_names
    assert Listed().xs == () and "__dict__" not in Listed.__init__.__code__.co_names


def test_a_field_named_like_a_local_and_keyword_only_fields_behave_as_dataclasses():
    def define(decorate):
        @decorate
        class Odd:
            d: int
            self_: int = 2
        return Odd
    fast, ref = define(frozen), define(dataclasses.dataclass(frozen=True))
    assert dataclasses.asdict(fast(1, 3)) == dataclasses.asdict(ref(1, 3)) == {"d": 1, "self_": 3}

    @frozen
    class Kw:
        a: int
        b: int = dataclasses.field(default=0, kw_only=True)
    with pytest.raises(TypeError):
        Kw(1, 2)  # keyword-only, as dataclasses makes it
    assert Kw(1, b=2).b == 2
