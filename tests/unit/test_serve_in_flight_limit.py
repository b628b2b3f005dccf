"""While a served room with ``decoding.questions_in_flight: 2`` still starts (the host
loading its layers, then waiting for the workers to load theirs and connect), /health,
/metrics and the room page say the room will answer 2 questions at once, as configured,
not 1 (there is no host scheduler yet). The limit itself: the setting, no more than the
deal's KV caches nor the frame header's slots, at least 1."""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import replace

import aiohttp

import runtime.serve.host as serve_host_mod
import runtime.transport
from planner.deal import Deal
from planner.frames import MAX_SLOTS
from planner.scheduler.config import SchedulerConfig
from planner.scheduler.host import in_flight_limit
from runtime.control import NodeConfig
from runtime.serve.server import RoomServer


def test_the_limit_is_the_setting_within_the_kv_caches_and_the_slots():
    pinned = Deal.pinned("h", [("h", 0, 15), ("w", 15, 30)])  # no KV caches counted
    cfg = SchedulerConfig(hidden=576, questions_in_flight=3)
    assert in_flight_limit(cfg, pinned) == 3
    assert in_flight_limit(cfg, replace(pinned, kv_caches=1)) == 1  # the stages hold one cache each
    assert in_flight_limit(cfg, replace(pinned, kv_caches=5)) == 3
    assert in_flight_limit(SchedulerConfig(hidden=576, questions_in_flight=MAX_SLOTS), pinned) == MAX_SLOTS


def test_health_metrics_and_the_page_say_the_configured_limit_while_the_room_starts(monkeypatch):
    cfg = NodeConfig(device="h", host="h", stages=[["h", 0, 15], ["w", 15, 30]],
                     scheduler={"hidden": 576, "questions_in_flight": 2}, model_dir="/nonexistent", peers=["w"])
    loading, loaded_may_return = threading.Event(), threading.Event()

    def load_device(c):  # the host's layers load until the test lets them
        loading.set()
        loaded_may_return.wait(30)
        return (None, None, None)
    monkeypatch.setattr(serve_host_mod, "load_device", load_device)
    waiting_for_workers = []

    async def connect_room(*a, **k):  # the workers never come: the room stays "connecting"
        waiting_for_workers.append(True)
        await asyncio.sleep(3600)
    monkeypatch.setattr(runtime.transport, "connect_room", connect_room)
    sock = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = RoomServer("smollm2-135m")

    async def seen(session) -> tuple:
        async with session.get(url + "/health") as r:
            health = (r.status, (await r.json())["queue"]["in_flight_limit"], (await r.json())["status"])
        async with session.get(url + "/metrics") as r:
            line, = [x for x in (await r.text()).splitlines() if x.startswith("splitroom_questions_in_flight_limit ")]
        return health, line, server.page.snapshot()["queue"]["in_flight_limit"]

    async def go():
        stop = asyncio.Event()
        task = asyncio.ensure_future(serve_host_mod.serve_host(cfg, "ws://127.0.0.1:1", "r", sock, "smollm2-135m",
                                                               stop=stop, server=server))
        got = []
        try:
            async with aiohttp.ClientSession() as session:
                for _ in range(500):  # bounded: the host is loading after its first turns
                    if loading.is_set() and server.phase == "loading":
                        break
                    await asyncio.sleep(0.01)
                got.append(await seen(session))
                loaded_may_return.set()
                for _ in range(500):
                    if waiting_for_workers and server.phase == "connecting":
                        break
                    await asyncio.sleep(0.01)
                got.append(await seen(session))
        finally:
            loaded_may_return.set()
            stop.set()
            await asyncio.wait_for(task, 30)
        return got
    try:
        got = asyncio.run(go())
    finally:
        sock.close()
    # the rule before: 1 in all three while no host scheduler existed
    assert got == [((503, 2, "starting"), "splitroom_questions_in_flight_limit 2.0", 2)] * 2
