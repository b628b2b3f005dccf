"""`splitroom join`'s handshake fed by hand, with no event loop, no transport and no
clock: which control messages a waiting device obeys (splitroom.join_handshake.Wait), and
the model host's round of hellos that ends in one Plan or one Abort for every peer
(HostRound). Expected values are written out here from the module's rules: only the
model host's plan, abort and bye count; the exit statuses are 2 (an abort), 3 (a needed
device lost or refused), 4 (a timeout)."""

from __future__ import annotations

import logging

import pytest

from runtime.config import ModelConfig
from runtime.control import Abort, Bye, Heartbeat, Hello, Plan
from splitroom.join_handshake import HostRound, Wait, from_host
from splitroom.join_options import JoinError

#: SmolLM2-135M's shape (its config.json): 30 layers, hidden 576
SMOL = ModelConfig(n_layers=30, hidden=576, n_heads=9, n_kv_heads=3, ffn=1536, vocab=49152,
                   rope_theta=100000.0, rms_eps=1e-5, name="SmolLM2-135M-Instruct")


def a_plan(host="h"):
    return Plan(host=host, stages=[[host, 0, 15], ["w", 15, 30]], scheduler={"hidden": 576}, max_new_tokens=4)


def test_only_the_known_model_host_may_send_a_plan_abort_or_bye():
    assert from_host("h", "h", a_plan("h"))
    assert from_host("h", "h", Bye()) and from_host("h", "h", Abort(reason="x"))
    assert not from_host(None, "h", a_plan("h"))  # no host known yet
    assert not from_host("h", "w2", Bye())  # another peer
    assert not from_host("h", "h", a_plan("w2"))  # the host's connection, a plan naming another host


def test_a_wait_takes_what_it_waits_for_and_logs_and_drops_the_rest(caplog):
    wait = Wait((Plan,), "the host's plan", ("h",))
    with caplog.at_level(logging.INFO, "splitroom.join"):
        assert wait.judge("h", a_plan(), "h") is True
        assert wait.judge("w2", a_plan("w2"), "h") is False  # a plan from a peer that is not the host
        assert wait.judge("h", Heartbeat(), "h") is False  # a type not waited for
        assert wait.judge("h", Bye(), None) is False  # the host not known yet
    said = [r.getMessage() for r in caplog.records]
    assert said == ["ignored a plan from w2: only the model host (h) may send one",
                    "control message 'heartbeat' from h ignored while waiting for the host's plan",
                    "ignored a bye from h: only the model host (not known yet) may send one"]


def test_the_hosts_abort_ends_the_wait_with_status_2_and_anothers_is_ignored():
    wait = Wait((Plan,), "the host's plan")
    assert wait.judge("w2", Abort(reason="no"), "h") is False
    with pytest.raises(JoinError) as e:
        wait.judge("h", Abort(reason="ranges overlap at layer 15"), "h")
    assert (str(e.value), e.value.status) == ("h stopped the room: ranges overlap at layer 15", 2)


def test_a_needed_device_lost_or_refused_ends_the_wait_with_status_3_and_the_timeout_has_4():
    wait = Wait((Hello,), "the other devices' hellos", ("w", "w2"))
    wait.check_peers({"x": "gone"}, {})  # not needed: nothing raised
    with pytest.raises(JoinError) as e:
        wait.check_peers({"w2": "ICE failed"}, {})
    assert (str(e.value), e.value.status) == ("lost w2 while waiting for the other devices' hellos: ICE failed", 3)
    with pytest.raises(JoinError) as e:  # a refusal is named before a loss
        wait.check_peers({"w": "gone"}, {"w": "bad proof"})
    assert e.value.status == 3 and str(e.value).startswith("refused w: bad proof (not the device it claims")
    err = wait.timed_out()
    assert (str(err), err.status) == ("timed out waiting for the other devices' hellos", 4)


def test_the_host_round_plans_once_every_hello_is_in():
    rnd = HostRound("h", ["w", "w2"], (0, 10), 0)
    assert not rnd.complete
    assert rnd.hello("w2", Hello(device="w2", layers=(20, 30))) is None
    assert not rnd.complete
    assert rnd.hello("w", Hello(device="w", layers=(10, 20), lends=1 << 30)) is None
    assert rnd.complete
    plan = rnd.outcome("r", SMOL, "memory", max_new_tokens=7)
    assert isinstance(plan, Plan)
    assert (plan.host, plan.max_new_tokens) == ("h", 7)
    assert [list(s) for s in plan.stages] == [["h", 0, 10], ["w", 10, 20], ["w2", 20, 30]]
    assert plan.scheduler.eos_token == 2  # the model's own end token (ModelConfig.eos_id)
    assert rnd.hellos["w"] == {"layers": [10, 20], "lends": 1 << 30}


def test_a_second_host_or_a_room_that_cannot_be_planned_gives_one_abort():
    rnd = HostRound("h", ["w"], (0, 15), 0)
    assert rnd.hello("w", Hello(device="w", host=True, layers=(15, 30))) == Abort(reason="w and h both say --host")
    assert "w" not in rnd.hellos and not rnd.complete
    rnd = HostRound("h", ["w"], (0, 15), 0)
    rnd.hello("w", Hello(device="w", layers=(16, 30)))  # layer 16 (0-based 15) held by no one
    out = rnd.outcome("r", SMOL, "memory")
    assert out == Abort(reason="ranges leave a gap at layer 16: h 1-15, w 17-30")
