"""``/health`` and ``/v1/models`` as a load balancer reads them: 503 unless the room is
ready, the model listed only when ready, and the stages of the deal the room runs now.

The server (runtime.serve.server.RoomServer) runs on aiohttp's test server with a
stand-in for the host's node: only the attributes the server reads (its chain's host
scheduler state and deal); no room, no model.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from aiohttp.test_utils import TestClient, TestServer

from planner.deal import Deal, Stage
from runtime.serve.server import RoomServer

INFO = {"host": "a", "stages": [{"device": "a", "start": 0, "end": 15, "shown": "1-15"},
                                {"device": "b", "start": 15, "end": 30, "shown": "16-30"}]}


def fake_node(stages, stopped=None, recovering=None):
    host = SimpleNamespace(stopped=stopped, recovering=recovering, queue=[], busy=False, in_flight=0, questions_in_flight=1)
    deal = Deal(host="a", split="pinned", stages=tuple(Stage(*s) for s in stages), guests=(), fits=True, notes=())
    return SimpleNamespace(chain=SimpleNamespace(host=host, deal=deal), tokenizer=None, observers=[],
                           cfg=SimpleNamespace(host="a"))


def with_client(server: RoomServer, steps) -> None:
    """Run ``await steps(get)`` on one event loop, ``get(path) -> (status, json, headers)``."""
    async def main():
        async with TestClient(TestServer(server.app)) as c:
            async def get(path: str):
                r = await c.get(path)
                return r.status, await r.json(), r.headers
            await steps(get)
    asyncio.run(main())


def test_health_is_503_until_ready_then_200():
    srv = RoomServer("m", INFO)

    async def steps(get):
        for phase in ("loading", "connecting"):
            srv.set_phase(phase, f"the room is starting ({phase})")
            status, body, _ = await get("/health")
            assert (status, body["ready"], body["status"]) == (503, False, "starting")
            assert (await get("/v1/models"))[1]["data"] == []
        srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
        status, body, _ = await get("/health")
        assert (status, body["ready"], body["status"]) == (200, True, "ready")
        assert [m["id"] for m in (await get("/v1/models"))[1]["data"]] == ["m"]
    with_client(srv, steps)


def test_health_is_503_while_re_dealing_and_after_the_room_stopped():
    srv = RoomServer("m", INFO)
    node = fake_node([("a", 0, 15), ("b", 15, 30)], recovering=object())
    srv.attach(node)

    async def steps(get):
        status, body, _ = await get("/health")
        assert (status, body["ready"], body["status"]) == (503, False, "unavailable")
        assert (await get("/v1/models"))[1]["data"] == []
        node.chain.host.recovering, node.chain.host.stopped = None, "b is lost"
        status, body, _ = await get("/health")
        assert status == 503 and "b is lost" in body["reason"]
    with_client(srv, steps)


def test_health_names_the_stages_of_the_deal_after_a_loss():
    srv = RoomServer("m", INFO)
    node = fake_node([("a", 0, 15), ("b", 15, 30)])
    srv.attach(node)

    async def steps(get):
        assert [s["shown"] for s in (await get("/health"))[1]["stages"]] == ["1-15", "16-30"]
        # b lost; the host re-dealt every layer to itself
        node.chain.deal = Deal(host="a", split="pinned", stages=(Stage("a", 0, 30),), guests=(), fits=True,
                               notes=())
        _, body, _ = await get("/health")
        assert [(s["device"], s["shown"]) for s in body["stages"]] == [("a", "1-30")]
        assert [(s["device"], s["shown"]) for s in body["room"]["stages"]] == [("a", "1-30")]
    with_client(srv, steps)


def test_the_queue_full_message_says_it_once():
    # the scheduler's two refusals (planner/scheduler.py), as a 429 says them
    srv = RoomServer("m", INFO)
    full = srv._refusal("queue full: 10 questions are waiting")
    assert full.status == 429 and full.message == "the room's queue is full: 10 questions are waiting"
    mine = srv._refusal("api:key-0123456789abcdef already has 2 questions waiting")
    assert mine.status == 429 and mine.message.count("waiting") == 1 and "queue is full" not in mine.message


def test_a_lost_relay_makes_a_ready_room_degraded_and_back():
    from runtime.serve.server import watch_relay
    srv = RoomServer("m", INFO)
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))

    async def steps(get):
        relay = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = relay.sockets[0].getsockname()[1]
        watch = asyncio.ensure_future(watch_relay(srv, f"ws://127.0.0.1:{port}", every_s=0.01))
        try:
            for _ in range(500):
                await asyncio.sleep(0.01)
                if watch.done() or srv.relay_lost is None:
                    break
            status, body, _ = await get("/health")
            assert (status, body["status"], body["ready"]) == (200, "ready", True)
            relay.close()
            await relay.wait_closed()
            for _ in range(500):  # bounded: the next probe finds the port closed
                if srv.relay_lost:
                    break
                await asyncio.sleep(0.01)
            status, body, _ = await get("/health")
            assert (status, body["status"], body["ready"]) == (200, "degraded", True)
            assert body["reason"].startswith("relay lost: no device can join")
        finally:
            watch.cancel()
    with_client(srv, steps)


def test_a_room_whose_workers_still_load_is_not_ready_and_lists_no_model():
    # join --serve: the host's node starts while the workers still load their layers;
    # a worker's node is heard (heartbeats) only once it runs.
    srv = RoomServer("m", INFO)
    from planner.liveness import Liveness
    node = fake_node([("a", 0, 15), ("b", 15, 30)])
    node.liveness = Liveness(["b"], beat_s=0.25, timeout_s=1.0, grace_s=1.0, load_timeout_s=1.0)  # the Node's
    srv.attach(node)

    async def steps(get):
        status, body, _ = await get("/health")
        assert (status, body["ready"]) == (503, False) and "waiting for b to load its layers" in body["reason"]
        assert (await get("/v1/models"))[1]["data"] == []
        node.liveness.heard("b", 1.0)
        status, body, _ = await get("/health")
        assert (status, body["ready"]) == (200, True)
        assert [m["id"] for m in (await get("/v1/models"))[1]["data"]] == ["m"]
    with_client(srv, steps)


def test_the_room_page_after_a_loss_keeps_the_lost_workers_role_and_shows_the_new_memory():
    # 30 layers of 10 MB and a 100 MB embedding on the host a: a 1-15 holds 250 MB,
    # b 16-30 150 MB; b lost, a holds 1-30: 400 MB.
    info = {**INFO, "devices": [{"id": "a", "lends_bytes": 10**9}, {"id": "b", "lends_bytes": 10**9}],
            "shares": [{"device": "a", "used_bytes": 250 * 10**6}, {"device": "b", "used_bytes": 150 * 10**6}],
            "layer_bytes": [10 * 10**6] * 30, "host_extra_bytes": 100 * 10**6}
    srv = RoomServer("m", info)
    node = fake_node([("a", 0, 15), ("b", 15, 30)])
    srv.attach(node)
    cards = {d["id"]: d for d in srv.page.snapshot()["devices"]}
    assert "250 MB" in cards["a"]["detail"] and "150 MB" in cards["b"]["detail"]
    node.chain.deal = Deal(host="a", split="pinned", stages=(Stage("a", 0, 30),), guests=(), fits=True, notes=())
    srv.lost.append("b")
    cards = {d["id"]: d for d in srv.page.snapshot()["devices"]}
    assert "400 MB" in cards["a"]["detail"] and cards["a"]["layers"] == "1-30"
    assert (cards["b"]["role"], cards["b"]["status"]) == ("worker", "lost")


def test_a_device_whose_lend_is_not_known_is_not_shown_as_0_mb():
    # join --serve: a device that said no --lends
    info = {**INFO, "devices": [{"id": "a", "lends_bytes": None}, {"id": "b", "lends_bytes": None}], "shares": []}
    srv = RoomServer("m", info)
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
    for card in srv.page.snapshot()["devices"]:
        assert "0 MB" not in card["lends"] and "0 MB" not in card["detail"], card


def test_the_room_page_merges_identical_clients_into_one_chip_and_drops_those_gone():
    from runtime.serve import page as page_mod
    now = [100.0]
    srv = RoomServer("m", {**INFO, "devices": [{"id": "a"}, {"id": "b"}]}, clock=lambda: now[0])
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
    for i in range(19):  # 19 keys, one question each; one of them asks twice; one browser guest
        srv.page.client_seen(f"api:key-{i:016x}")
    srv.page.client_seen("api:key-0000000000000003")
    srv.page.client_seen("guest:g1")
    clients = srv.page.snapshot()["clients"]
    assert [(c["kind"], c["count"], c["questions"]) for c in clients] == [("api", 19, 20), ("guest", 1, 1)]
    now[0] += page_mod.CLIENT_SHOWN_S / 2
    srv.page.client_seen("api:key-0000000000000003")  # still asking: it stays, the rest leave later
    now[0] += page_mod.CLIENT_SHOWN_S / 2 + 1
    assert [(c["kind"], c["ids"]) for c in srv.page.snapshot()["clients"]] == [("api", ["api:key-0000000000000003"])]
    now[0] += page_mod.CLIENT_SHOWN_S + 1
    assert srv.page.snapshot()["clients"] == []


def test_each_device_card_shows_its_own_figures_not_the_room_wide_lap():
    from planner.frames import FrameHeader, FrameKind
    from planner.protocol import Computed, FrameArrived, SendFrame
    now = [0.0]

    def room(stages):
        srv = RoomServer("m", {**INFO, "devices": [{"id": x} for x, _, _ in stages]}, clock=lambda: now[0])
        srv.attach(fake_node(stages))
        srv.phase = "serving"
        return srv

    def laps(srv, last, times_ms, host_ms):  # each lap: the host computes, sends, it comes back
        for lap, (away, (stage, head)) in enumerate(zip(times_ms, host_ms), start=1):
            h = FrameHeader(FrameKind.DECODE, 1, lap, lap, 1, 576)
            srv._observe(Computed("a", "RunStage", lap, stage / 1000))
            srv._observe(Computed("a", "Draft", lap, 0.5))  # a draft is not the stage's time
            srv._observe(SendFrame("a", "b", h))
            now[0] += away / 1000
            srv._observe(FrameArrived("a", last, FrameHeader(FrameKind.RESULT, 1, lap, lap, 1, 576)))
            srv._observe(Computed("a", "RunHead", lap, head / 1000))

    # host a (4 + 1 ms, then 6 + 1 ms per lap), one worker b (10 ms, then 20 ms away from a)
    srv = room([("a", 0, 15), ("b", 15, 30)])
    laps(srv, "b", [10, 20], [(4, 1), (6, 1)])
    cards = {d["id"]: d for d in srv.page.snapshot()["devices"]}
    assert abs(cards["a"]["stage_ms"] - 6.0) < 1e-9 and cards["a"]["round_ms"] is None  # (4+1+6+1) / 2
    assert abs(cards["b"]["round_ms"] - 15.0) < 1e-9 and cards["b"]["stage_ms"] is None  # (10+20) / 2
    assert cards["a"]["tokens_handled"] == cards["b"]["tokens_handled"] == 2
    # two workers: the host times only their way round, said as shared by 2, never as one's own
    srv = room([("a", 0, 10), ("b", 10, 20), ("c", 20, 30)])
    laps(srv, "c", [30], [(3, 1)])
    cards = {d["id"]: d for d in srv.page.snapshot()["devices"]}
    assert abs(cards["a"]["stage_ms"] - 4.0) < 1e-9
    for w in "bc":
        assert cards[w]["round_ms"] is None and abs(cards[w]["shared_ms"] - 30.0) < 1e-9 and cards[w]["shared_by"] == 2


def test_each_device_screen_shows_ms_per_layer_of_its_one_position_laps():
    """layer_ms: the host's RunStage of each one-position lap over its 15 layers, a
    worker's time with each one-position lap (StageTimed) over its 15; a prefill lap of 9
    positions and a lap the page never saw leave are not counted. Figures by hand."""
    from planner.frames import FrameHeader, FrameKind
    from planner.hops import StageTimed
    from planner.protocol import Computed, SendFrame
    srv = RoomServer("m", {**INFO, "devices": [{"id": "a"}, {"id": "b"}]}, clock=lambda: 0.0)
    srv.attach(fake_node([("a", 0, 15), ("b", 15, 30)]))
    srv.phase = "serving"
    for lap, tokens, host_s, worker_s in [(1, 9, 0.030, 0.090), (2, 1, 0.003, 0.015), (3, 1, 0.006, 0.030)]:
        srv._observe(Computed("a", "RunStage", lap, host_s))
        srv._observe(SendFrame("a", "b", FrameHeader(FrameKind.DECODE, 1, lap, 0, tokens, 576)))
        srv._observe(StageTimed("b", lap, worker_s))
    srv._observe(SendFrame("a", "b", FrameHeader(FrameKind.DECODE, 1, 4, 0, 1, 576)))
    srv._observe(Computed("a", "RunStage", 4, 0.009))  # its Computed after its lap left: counted too
    srv._observe(StageTimed("b", 99, 5.0))  # a lap the page did not see leave
    cards = {d["id"]: d for d in srv.page.snapshot()["devices"]}
    assert cards["a"]["layer_ms"] == pytest.approx((3 + 6 + 9) / 3 / 15)
    assert cards["b"]["layer_ms"] == pytest.approx((15 + 30) / 2 / 15)


def test_health_and_metrics_after_a_device_comes_back_say_it_is_back_and_the_room_ready():
    # The host's node gives its observers (RoomServer.attach) each event and command in
    # order: b lost, the re-deal to a 1-30, ready; b says hello again (DeviceBack), the
    # rejoin rule deals it back (Redeal.back), ready. After the rejoin nothing is lost
    # and the room is ready, with the first deal's stages.
    from prometheus_client import generate_latest

    from planner.protocol import ChainReady, DeviceBack, DeviceLost, Redeal
    info = {**INFO, "devices": [{"id": "a", "lends_bytes": 10**9}, {"id": "b", "lends_bytes": 10**9}]}
    srv = RoomServer("m", info)
    node = fake_node([("a", 0, 15), ("b", 15, 30)])
    srv.attach(node)
    host = node.chain.host

    def feed(*objs):
        for o in objs:
            for fn in node.observers:
                fn(o)

    def metric(text: str, name: str) -> float:
        return float(next(ln.split()[-1] for ln in text.splitlines() if ln.startswith(name + " ")))

    async def steps(get):
        host.recovering = 7
        feed(DeviceLost("b", "no heartbeat for 1.1 s"), Redeal("b", "a", (("a", 0, 30),), 7))
        status, body, _ = await get("/health")
        assert (status, body["lost"]) == (503, ["b"]) and "after b left" in body["reason"]
        host.recovering = None
        node.chain.deal = Deal(host="a", split="pinned", stages=(Stage("a", 0, 30),), guests=(), fits=True, notes=())
        feed(ChainReady(7))
        status, body, _ = await get("/health")
        assert (status, body["ready"], body["lost"]) == (200, True, ["b"])
        assert {d["id"]: d["status"] for d in srv.page.snapshot()["devices"]}["b"] == "lost"
        text = generate_latest(srv.registry).decode()  # what GET /metrics answers
        assert (metric(text, "splitroom_ready"), metric(text, "splitroom_devices_out")) == (1.0, 1.0)

        host.recovering = 12
        feed(DeviceBack("b", "said hello again"), Redeal("", "a", (("a", 0, 15), ("b", 15, 30)), 12, back="b"))
        status, body, _ = await get("/health")
        assert (status, body["ready"], body["lost"]) == (503, False, [])
        assert body["reason"] == "re-dealing the layers: b came back"
        host.recovering = None
        node.chain.deal = Deal(host="a", split="pinned", stages=(Stage("a", 0, 15), Stage("b", 15, 30)), guests=(),
                               fits=True, notes=())
        feed(ChainReady(12))
        status, body, _ = await get("/health")
        assert (status, body["status"], body["ready"], body["lost"]) == (200, "ready", True, [])
        assert [(s["device"], s["shown"]) for s in body["stages"]] == [("a", "1-15"), ("b", "16-30")]
        assert [m["id"] for m in (await get("/v1/models"))[1]["data"]] == ["m"]
        cards = {d["id"]: d for d in srv.page.snapshot()["devices"]}
        assert (cards["b"]["status"], cards["b"]["layers"]) == ("serving", "16-30")

    with_client(srv, steps)
    text = generate_latest(srv.registry).decode()
    assert metric(text, "splitroom_ready") == 1.0
    assert metric(text, "splitroom_devices_out") == 0.0
    assert metric(text, "splitroom_devices_lost_total") == 1.0
    assert metric(text, "splitroom_devices_back_total") == 1.0


def test_the_device_screen_shows_loading_percent_tok_s_tokens_handled_and_ms_per_hop():
    """Page 001's device screen as the host computes it: a device that said Progress is
    "Loading N%" (and the room is not ready) until 100; tok/s over the passes of the last
    RATE_WINDOW_S (the first left out); ms per hop the mean of the hops into it; /metrics
    has each link's hops. Times passed in; figures by hand."""
    from planner.frames import FrameHeader, FrameKind
    from planner.hops import HopTimed
    from planner.protocol import SendFrame
    from runtime.control import Progress
    from runtime.serve import page as page_mod
    now = [0.0]
    srv = RoomServer("m", {**INFO, "devices": [{"id": "a"}, {"id": "b"}]}, clock=lambda: now[0])
    node = fake_node([("a", 0, 15), ("b", 15, 30)])
    node.progress = {"b": 40}
    node.liveness = SimpleNamespace(last_heard={"b": 0.0})
    srv.attach(node)
    card = {d["id"]: d for d in srv.page.snapshot()["devices"]}["b"]
    assert (card["status"], card["title"]) == ("loading", "Loading 40%")
    assert srv.readiness()[:2] == (False, "the room is starting: waiting for b to load its layers")
    node.progress["b"] = 100
    srv._observe(Progress(percent=100))
    assert srv.readiness()[0] and {d["id"]: d for d in srv.page.snapshot()["devices"]}["b"]["title"] == "Serving"
    events: asyncio.Queue = asyncio.Queue()  # what a room page listening now hears
    srv.page.subscribers.add(events)
    # passes: a prefill of 9 positions at t=0, then one token at 0.5, 1.0, 1.5 s
    for t, tokens in [(0.0, 9), (0.5, 1), (1.0, 1), (1.5, 1)]:
        now[0] = t
        srv._observe(SendFrame("a", "b", FrameHeader(FrameKind.DECODE, 1, int(t * 10) + 1, 0, tokens, 576)))
    for hop in [HopTimed("a", "b", 1, 0.004, 0.001), HopTimed("a", "b", 6, 0.006, 0.0005),
                HopTimed("b", "a", 1, 0.002, 0.0005)]:
        srv._observe(hop)
    flashed = [e["data"]["devices"] for e in iter(lambda: events.get_nowait() if not events.empty() else None, None)
               if e["event"] == "pass"]
    # every device of the chain flashes as each of the 4 laps leaves the host; a timed hop flashes nothing more
    assert flashed == [["a", "b"]] * 4, flashed
    srv.page.subscribers.discard(events)
    cards = {d["id"]: d for d in srv.page.snapshot()["devices"]}
    assert cards["b"]["tokens_handled"] == cards["a"]["tokens_handled"] == 12
    assert cards["b"]["tokens_per_s"] == pytest.approx(3 / 1.5)  # 3 positions after the first pass, over 1.5 s
    assert cards["b"]["hop_ms"] == pytest.approx(5.0) and cards["b"]["hop_from"] == ["a"]  # (4 + 6) / 2
    assert cards["b"]["hop_error_ms"] == pytest.approx(0.5)  # the last hop's bound
    assert cards["a"]["hop_ms"] == pytest.approx(2.0) and cards["a"]["hop_from"] == ["b"]
    now[0] = 1.0 + page_mod.RATE_WINDOW_S + 0.01  # only the pass at 1.5 s is within the window
    assert {d["id"]: d for d in srv.page.snapshot()["devices"]}["b"]["tokens_per_s"] is None
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(srv.registry).decode())}
    samples = {(s.name, s.labels.get("src"), s.labels.get("dst"), s.labels.get("le")): s.value
               for s in fams["splitroom_hop_seconds"].samples}
    assert samples["splitroom_hop_seconds_count", "a", "b", None] == 2
    assert samples["splitroom_hop_seconds_sum", "a", "b", None] == pytest.approx(0.010)
    assert samples["splitroom_hop_seconds_bucket", "a", "b", "0.005"] == 1  # 4 ms in, 6 ms out
    assert samples["splitroom_hop_seconds_count", "b", "a", None] == 1
    errs = {(s.labels["src"], s.labels["dst"]): s.value for s in fams["splitroom_hop_clock_error_seconds"].samples}
    assert errs == {("a", "b"): 0.0005, ("b", "a"): 0.0005}
