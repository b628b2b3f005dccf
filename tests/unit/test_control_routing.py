"""Which control messages a joined device's transport hands to its room (runtime.room.Node)
and which wait in join's handshake queue: one list in runtime.control, so a message type
added later goes where its list says."""

from __future__ import annotations

import typing

from runtime.control import (HANDSHAKE_MESSAGES, ROOM_MESSAGES, Bye, ControlMessage, Heartbeat, Hello, Loading,
                             encode_control)
from splitroom.join_cmd import CONTROL, _Mux


class _Transport:
    """The two hooks _Mux installs, and nothing else."""

    def __init__(self):
        self.handler = None

    def set_handler(self, fn):
        self.handler = fn


def test_every_control_message_is_of_the_handshake_or_of_the_running_room_once():
    union = typing.get_args(typing.get_args(ControlMessage)[0])
    kinds = [m.model_fields["type"].default for m in union]
    assert sorted(kinds) == sorted(set(kinds))
    assert {m.model_fields["type"].default for m in HANDSHAKE_MESSAGES} == {"hello", "plan", "abort", "bye"}
    assert {m.model_fields["type"].default for m in ROOM_MESSAGES} == {
        "heartbeat", "replan", "loading", "ready", "crash", "fault", "stamps", "progress", "unreachable"}
    assert set(HANDSHAKE_MESSAGES) | set(ROOM_MESSAGES) == set(union)
    assert not set(HANDSHAKE_MESSAGES) & set(ROOM_MESSAGES)


def test_a_running_rooms_messages_reach_the_node_and_the_handshakes_wait_in_the_queue():
    """A worker's Loading (it took a Replan) reaches the host's Node as its heartbeats
    do; a Bye waits for join's handshake."""
    t = _Transport()
    mux = _Mux(t)
    got = []
    mux.set_handler(lambda src, channel, data: got.append((src, data)))
    loading, beat, hello = (encode_control(Loading(first_lap=7)), encode_control(Heartbeat()),
                            encode_control(Hello(device="w1")))
    for data in (loading, beat, hello):  # a Hello once the room runs: a device back (runtime.room)
        t.handler("w1", CONTROL, data)
    assert got == [("w1", loading), ("w1", beat), ("w1", hello)]
    assert mux.control.empty()
    t.handler("h", CONTROL, encode_control(Bye()))
    assert got[3:] == [] and mux.control.get_nowait() == ("h", Bye())
