"""The typed control plane (runtime/control.py): hello/plan/abort/bye and the node
configuration parse what the devices send, refuse anything else with one line, and
round-trip through JSON."""

from __future__ import annotations

import json

import pytest

from planner.frames import DType
from planner.protocol import ReturnPath
from planner.scheduler import SchedulerConfig
from runtime.control import (Abort, Bye, ControlError, Hello, NodeConfig, Plan, SchedulerSettings, encode_control,
                             parse_control)


def test_the_four_messages_round_trip_as_the_json_devices_send():
    # written by hand: the wire form documented in splitroom/join_cmd.py
    hello = parse_control(b'{"type": "hello", "device": "w", "host": false, "layers": [15, 30], "lends": 4096}')
    assert hello == Hello(device="w", host=False, layers=(15, 30), lends=4096)
    auto = parse_control(b'{"type": "hello", "device": "a", "layers": null}')
    assert auto.layers is None and auto.lends == 0 and auto.host is False
    plan = parse_control(json.dumps({"type": "plan", "host": "h", "stages": [["h", 0, 15], ["w", 15, 30]],
                                     "scheduler": {"hidden": 576, "eos_token": 2}, "max_new_tokens": 8}))
    assert plan.stages == (("h", 0, 15), ("w", 15, 30)) and plan.scheduler.eos_token == 2
    assert [(s.device, s.start, s.end) for s in plan.deal().stages] == [("h", 0, 15), ("w", 15, 30)]
    assert parse_control(b'{"type": "abort", "reason": "x"}') == Abort(reason="x")
    assert parse_control(b'{"type": "bye"}') == Bye()
    for m in (hello, auto, plan, Abort(reason="r"), Bye()):
        assert parse_control(encode_control(m)) == m


@pytest.mark.parametrize("bad", [
    b"not json", b"[]", b'{"type": "hi"}', b'{"device": "w"}',
    b'{"type": "hello", "device": ""}',
    b'{"type": "hello", "device": "w", "lends": -1}',
    b'{"type": "hello", "device": "w", "layers": [1]}',
    b'{"type": "hello", "device": "w", "extra": 1}',
    b'{"type": "plan", "host": "h", "stages": [], "scheduler": {"hidden": 576}, "max_new_tokens": 8}',
    b'{"type": "plan", "host": "h", "stages": [["h", 0, 30]], "scheduler": {"hidden": 0}, "max_new_tokens": 8}',
    b'{"type": "plan", "host": "h", "stages": [["h", 0, 30]], "scheduler": {"hidden": 576}, "max_new_tokens": 0}',
])
def test_malformed_control_messages_are_one_line_errors(bad):
    with pytest.raises(ControlError) as e:
        parse_control(bad)
    assert "\n" not in str(e.value) and str(e.value).startswith("bad control message")


def test_scheduler_settings_carry_a_scheduler_config_both_ways():
    cfg = SchedulerConfig(hidden=576, prefill_chunk=8, draft_tokens=3, async_laps=2, return_path="via_stages",
                          wake=False, phones=frozenset({"p2", "p1"}), eos_token=2, dtype=DType.FLOAT16)
    s = SchedulerSettings.of(cfg)
    assert s.phones == ("p1", "p2") and s.dtype == 1 and s.return_path == ReturnPath.VIA_STAGES
    assert s.config() == cfg
    assert SchedulerSettings.model_validate_json(s.model_dump_json()).config() == cfg


def test_node_config_validates_and_round_trips():
    cfg = NodeConfig(device="w", host="h", stages=[["h", 0, 15], ["w", 15, 30]], scheduler={"hidden": 576},
                     model_dir="/m", prompts=[], peers=["h"])
    back = NodeConfig.from_json(cfg.to_json())
    assert back == cfg and back.stages == [("h", 0, 15), ("w", 15, 30)]
    assert back.scheduler_config() == SchedulerConfig(hidden=576)
    good = json.loads(cfg.to_json())
    for key, value in [("backend", "cuda"), ("slowdown", 0.5), ("max_new_tokens", 0), ("drafter", "x"),
                       ("nonsense", 1)]:
        with pytest.raises(ControlError) as e:
            NodeConfig.from_json(json.dumps(good | {key: value}))
        assert "\n" not in str(e.value) and key in str(e.value)
    with pytest.raises(ControlError):
        NodeConfig.from_json("{")
