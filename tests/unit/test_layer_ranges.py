"""One meaning of a layer range a person types: 1-based and inclusive in scenario
stages, ``join --layers`` and ``generate --layers`` alike (planner.deal.parse_layers),
shown back the same way (planner.deal.shown_layers)."""

from __future__ import annotations

import pytest

from planner.deal import LayerRangeError, parse_layers, shown_layers
from splitroom.generate_cmd import parse_layers as generate_layers
from splitroom.join_cmd import parse_layers as join_layers
from splitroom.scenario import load


def test_1_15_is_the_first_fifteen_layers_in_every_command():
    # the first fifteen of 30 layers are indexes 0..14: [0, 15) in the code
    assert generate_layers("1-15", 30).ranges == ((0, 15), (15, 30))
    assert join_layers("1-15", 30) == (0, 15)
    scn = load("scenarios/home.yaml", ["stages=[{device: desktop, layers: '1-15'}, {device: laptop, layers: '16-30'}]",
                                       "host=desktop"])
    assert [(p.start, p.end) for p in scn.options.stages] == [(0, 15), (15, 30)]
    assert generate_layers("1-10,11-20", 30).ranges == ((0, 10), (10, 20), (20, 30))


def test_the_old_zero_based_form_is_one_clear_line():
    with pytest.raises(ValueError) as e:
        generate_layers("0-15", 30)
    msg = str(e.value)
    assert "\n" not in msg and "1-based" in msg and "1-15" in msg
    with pytest.raises(ValueError, match="must start at layer 11"):
        generate_layers("1-10,12-20", 30)


@pytest.mark.parametrize("text,want", [("1-15", (0, 15)), ("7", (6, 7)), (" 3 - 4 ", (2, 4)), ("30-30", (29, 30))])
def test_parse_and_show_are_inverse(text, want):
    assert parse_layers(text, 30) == want
    assert parse_layers(shown_layers(*want), 30) == want


@pytest.mark.parametrize("text,malformed", [("x", True), ("1-2-3", True), ("-5", True), ("0-3", False),
                                            ("5-4", False), ("1-31", False)])
def test_bad_ranges(text, malformed):
    with pytest.raises(LayerRangeError) as e:
        parse_layers(text, 30)
    assert e.value.malformed is malformed


def test_shown_layers_reads_as_people_count():
    assert [shown_layers(0, 22), shown_layers(39, 40), shown_layers(3, 3)] == ["1-22", "40", "none"]
    assert [shown_layers(21, 30, words=True), shown_layers(29, 30, words=True)] == ["layers 22-30", "layer 30"]


def test_an_empty_range_in_words_is_no_layers():
    assert shown_layers(3, 3, words=True) == "no layers"


@pytest.mark.parametrize("text,message", [
    ("1-x", "expected a range like '1-13' (1-based, inclusive), got '1-x'"),
    ("5-40", "range '5-40' is outside 1-30 or reversed (1-based, inclusive)"),
])
def test_a_bad_range_says_what_was_typed_and_what_is_expected(text, message):
    with pytest.raises(LayerRangeError) as e:
        parse_layers(text, 30)
    assert str(e.value) == message


def test_a_stage_and_generate_show_a_range_as_the_deal_does():
    from runtime.backends.base import StageSpec
    assert [StageSpec(0, 15).label(), StageSpec(29, 30).label(), StageSpec(3, 3).label()] == [
        "layers 1-15", "layer 30", "no layers"]
    assert generate_layers("1-29", 30).describe() == "host: layers 1-29; worker 1: layer 30"
