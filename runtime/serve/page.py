"""The room page (``GET /``) and its live updates, on the model host.

Plain HTML, CSS and JavaScript from ``runtime/serve/static/`` (no build step, nothing
fetched from the internet). The page reads ``GET /api/room`` (a snapshot) and listens
to ``GET /api/events`` (server-sent events): ``state`` (a new snapshot, at most every
0.25 s after a change and every 2 s anyway) and ``pass`` (a lap left the host: every
device of the chain flashes its hop dot; the host hears when the lap reached each worker
only with that worker's stamps, up to 0.25 s later, so the dots flash as the lap leaves). Its chat box posts to ``/v1/chat/completions``.

What each device's screen says (product page 001), as the host knows it:

* ``Standing by``: no model is running yet (a device of the scenario outside the chain).
* ``Loading N%``: this device is loading its layers and told the host how far it is
  (runtime.control.Progress: a browser tab's download, a worker's copy of re-dealt
  layers over the weights channel); ``Loading`` with no percentage while the room starts
  and the device said none (a Python worker reading its own disk), or while a worker of
  the chain has not been heard yet.
* ``Serving``: holds layers, e.g. "Layers 5-23 · 270 MB · SmolLM2-135M-Instruct".
* ``Not holding layers``: in the room but dealt no layers.
* ``Left the room``: the host lost it (with the reason). ``Re-dealing``: the host is
  dealing a lost device's layers to the others. ``Room over``: the room stopped.

While serving, each device of the chain shows its own figures:

* ``tokens_handled``: positions of every lap that passed it; ``passes``: those laps;
* ``tokens_per_s``: the positions of its passes of the last :data:`RATE_WINDOW_S`
  seconds, the first one's left out, over the time from the first to the last (None
  with fewer than two passes in the window): every device of a chain handles every
  position, so it is the room's rate as this device sees it;
* ``hop_ms``: the mean of the last :data:`HOPS_KEPT` hops into it (planner/hops.py: the
  frame handed to the sender's transport until this device had it, each device's
  stamps on the host's clock), with ``hop_from`` (the senders) and ``hop_error_ms``
  (the last hop's bound from the clock offsets);
* the model host: ``stage_ms``, its own compute per lap (its layers and the output head:
  the mean of its ``Computed`` RunStage + RunHead seconds over its RunStage count);
* ``layer_ms``: ms per layer of one position, the mean of its last :data:`LAYER_LAPS_KEPT`
  one-position laps over the layers it holds: on the model host its RunStage compute
  (the head left out), on a worker the lap's time at it from its own two stamps
  (planner.hops.StageTimed: the frame had until the lap's frame handed on, its stage and
  any wait for it), so a browser tab's figure stands beside a Python worker's;
* the one worker of a two-device chain: ``round_ms``, the host's frame out to its return
  (the hop out, the worker's stage, the hop back);
* with several workers the host times only their whole way round: ``shared_ms`` (that
  time) and ``shared_by`` (how many workers share it), never shown as one device's own.
API clients show as one "API client" chip (browser guests as one "Guest" chip) with how
many there are, no layers, and are not counted as devices: the
:data:`MAX_CLIENTS_SHOWN` that asked last within :data:`CLIENT_SHOWN_S` (a client that
has not asked for that long has left the page); the page keeps
at most :data:`MAX_CLIENTS_KEPT` (the most recent) and forgets a client once it is no
longer shown.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Optional

from aiohttp import web

STATIC = Path(__file__).parent / "static"
#: live-update subscribers at once; more get 503
MAX_SUBSCRIBERS = 64
#: events queued for a slow subscriber before new ones are dropped
SUBSCRIBER_QUEUE = 256
#: an API client is shown for this long after its last request, seconds
CLIENT_SHOWN_S = 300.0
#: API clients the page keeps (the most recent; older ones are forgotten) and shows
MAX_CLIENTS_KEPT = 1000
MAX_CLIENTS_SHOWN = 50
#: a device's tokens per second are over its passes of this many latest seconds
RATE_WINDOW_S = 10.0
#: passes kept per device for its rate, at most
PASSES_KEPT = 1024
#: hops into a device its hop_ms is the mean of
HOPS_KEPT = 32
#: one-position laps a device's layer_ms is the mean of
LAYER_LAPS_KEPT = 32
#: laps whose positions the page keeps (to tell one-position laps), and the model host's
#: stage times waiting for their lap to leave it, at most
LAPS_KEPT = 1024


def _bounded(d: OrderedDict, key, value) -> None:
    d[key] = value
    while len(d) > LAPS_KEPT:
        d.popitem(last=False)


def _mb(n: Optional[int]) -> str:
    if n is None:
        return "size not known"
    if not n:
        return "0 MB"
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


class RoomPage:
    """The page's routes and live state over a room server.

    Args:
        server: the :class:`runtime.serve.server.RoomServer` whose observations feed
            the page (not imported here: the server imports this module).
        clock: seconds (``time.monotonic``).
    """

    def __init__(self, server, clock=time.monotonic):
        self.server = server
        self.clock = clock
        self.subscribers: set[asyncio.Queue] = set()
        self.tokens_handled: dict[str, int] = {}
        self.passes: dict[str, int] = {}
        self.compute_s: dict[str, float] = {}  # RunStage + RunHead seconds each device computed
        self.stage_runs: dict[str, int] = {}  # RunStage commands each device computed
        self.recent: dict[str, deque] = {}  # device -> (time, positions) of its latest passes
        self.hops_in: dict[str, deque] = {}  # device -> (sender, seconds, error_s) of its latest hops in
        self.lap_tokens: OrderedDict[int, int] = OrderedDict()  # lap id -> its positions (the latest laps)
        self._host_stage_s: OrderedDict[int, tuple[str, float]] = OrderedDict()  # lap id -> host's RunStage s
        self.one_position_s: dict[str, deque] = {}  # device -> seconds of its latest one-position laps
        self.clients: OrderedDict[str, dict] = OrderedDict()  # least recently seen first
        self._pending: Optional[asyncio.TimerHandle] = None
        self._last_push = 0.0

    def add_routes(self, app: web.Application) -> None:
        """``/`` (``/share.html``: the same page, asking as a browser guest over WebRTC),
        ``/room.js``, ``/room.css``, ``/api/room``, ``/api/events``."""
        app.router.add_get("/", self.index)
        app.router.add_get("/share.html", self.index)  # the same page, as a guest over WebRTC
        app.router.add_get("/room.js", self.static("room.js", "application/javascript"))
        app.router.add_get("/room.css", self.static("room.css", "text/css"))
        app.router.add_get("/api/room", self.room)
        app.router.add_get("/api/events", self.events)

    # -- what the server tells the page ------------------------------------------------

    def lap_sent(self, lap_tokens: int, lap_id: Optional[int] = None) -> None:
        """A lap of ``lap_tokens`` positions left the host: every stage will handle it."""
        node = self.server.node
        if node is None:
            return
        if lap_id is not None:
            _bounded(self.lap_tokens, lap_id, lap_tokens)
            held = self._host_stage_s.pop(lap_id, None)
            if held is not None and lap_tokens == 1:
                self._one_position(*held)
        chain = [s.device for s in node.chain.deal.stages]
        now = self.clock()
        for d in chain:
            self.tokens_handled[d] = self.tokens_handled.get(d, 0) + lap_tokens
            self.passes[d] = self.passes.get(d, 0) + 1
            self.recent.setdefault(d, deque(maxlen=PASSES_KEPT)).append((now, lap_tokens))
        self._broadcast({"event": "pass", "data": {"devices": chain, "tokens": lap_tokens}})

    def _one_position(self, device: str, seconds: float) -> None:
        self.one_position_s.setdefault(device, deque(maxlen=LAYER_LAPS_KEPT)).append(seconds)

    def stage_timed(self, st) -> None:
        """A :class:`planner.hops.StageTimed`: a one-position lap counts for its worker's layer_ms."""
        if self.lap_tokens.get(st.lap_id) == 1:
            self._one_position(st.device, st.seconds)

    def hop(self, hop) -> None:
        """A :class:`planner.hops.HopTimed` was measured: it counts for its receiver."""
        self.hops_in.setdefault(hop.dst, deque(maxlen=HOPS_KEPT)).append((hop.src, hop.seconds, hop.error_s))

    def tokens_per_s(self, device: str) -> Optional[float]:
        """``device``'s positions per second over its passes of the last
        :data:`RATE_WINDOW_S` (module doc), or None."""
        now = self.clock()
        window = [(t, n) for t, n in self.recent.get(device, ()) if now - t <= RATE_WINDOW_S]
        if len(window) < 2 or window[-1][0] <= window[0][0]:
            return None
        return sum(n for _, n in window[1:]) / (window[-1][0] - window[0][0])

    def computed(self, device: str, command: str, seconds: float, lap_id: Optional[int] = None) -> None:
        """``device`` computed ``command`` (RunStage, RunHead, Draft) of lap ``lap_id`` in
        ``seconds`` (a Computed trace record); drafts are not part of its stage time. A
        RunStage counts for layer_ms once its lap leaves with one position (:meth:`lap_sent`)."""
        if command not in ("RunStage", "RunHead"):
            return
        self.compute_s[device] = self.compute_s.get(device, 0.0) + seconds
        if command == "RunStage":
            self.stage_runs[device] = self.stage_runs.get(device, 0) + 1
            if lap_id is not None and lap_id in self.lap_tokens:  # its lap left already
                if self.lap_tokens[lap_id] == 1:
                    self._one_position(device, seconds)
            elif lap_id is not None:
                _bounded(self._host_stage_s, lap_id, (device, seconds))

    def client_seen(self, client: str) -> None:
        """An API client asked a question (it becomes the most recent; clients past
        :data:`CLIENT_SHOWN_S` or :data:`MAX_CLIENTS_KEPT` are forgotten)."""
        now = self.clock()
        c = self.clients.pop(client, None) or {"questions": 0}
        c["questions"] += 1
        c["seen"] = now
        self.clients[client] = c
        while self.clients:
            oldest = next(iter(self.clients.values()))
            if len(self.clients) <= MAX_CLIENTS_KEPT and now - oldest["seen"] <= CLIENT_SHOWN_S:
                break
            self.clients.popitem(last=False)
        self.changed()

    def changed(self) -> None:
        """Something the page shows changed: push a snapshot soon (at most every 0.25 s)."""
        if not self.subscribers or self._pending is not None:
            return
        wait = max(0.0, 0.25 - (self.clock() - self._last_push))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._pending = loop.call_later(wait, self._push_state)

    def _push_state(self) -> None:
        self._pending = None
        self._last_push = self.clock()
        self._broadcast({"event": "state", "data": self.snapshot()})

    def _broadcast(self, item: dict) -> None:
        for q in list(self.subscribers):
            if q.qsize() < SUBSCRIBER_QUEUE:
                q.put_nowait(item)

    # -- the snapshot ----------------------------------------------------------------------

    def snapshot(self) -> dict:
        """Everything the page shows, JSON-ready (see module doc)."""
        srv = self.server
        info = srv.room_info
        ready, reason, _ = srv.readiness()
        host = srv._host()
        node = srv.node
        model_name = (info.get("model") or {}).get("name", srv.model_id)
        stages = ([(s.device, s.start, s.end) for s in node.chain.deal.stages] if node is not None
                  else [(s["device"], s["start"], s["end"]) for s in info.get("stages", [])])
        shares_used = {sh["device"]: sh.get("used_bytes") for sh in info.get("shares", [])}
        layer_bytes, extra = info.get("layer_bytes"), info.get("host_extra_bytes") or 0
        used = {}  # bytes each device holds in the deal the room runs now (after a re-deal too)
        for x, a, b in stages:
            if layer_bytes and len(layer_bytes) >= b:
                used[x] = sum(layer_bytes[a:b]) + (extra if x == info.get("host") else 0)
            elif shares_used.get(x):
                used[x] = shares_used[x]
        why = {sh["device"]: sh.get("why", "") for sh in info.get("shares", [])}
        host_id = info.get("host")
        lap_s = srv.lap_mean_s()
        first_stages = {s["device"] for s in info.get("stages", [])}
        progress = dict(getattr(node, "progress", None) or {})
        unheard = set()
        heard = getattr(getattr(node, "liveness", None), "last_heard", None)
        if heard is not None:
            unheard = {x for x, _, _ in stages if x != host_id and x not in heard}
        workers = [x for x, _, _ in stages if x != host_id]
        lap_ms = lap_s * 1000 if lap_s is not None else None
        devices = []
        for d in info.get("devices", []):
            dev = d["id"]
            mine = [(a, b) for x, a, b in stages if x == dev]
            layers = f"{mine[0][0] + 1}-{mine[0][1]}" if mine else None
            if dev in srv.lost:
                status, title, detail = "lost", "Left the room", "the model host lost it"
            elif srv.phase in ("stopping", "failed") or (host is not None and host.stopped):
                status, title = "over", "Room over"
                detail = reason or "the room stopped"
            elif srv.phase != "serving" or (mine and (progress.get(dev, 100) < 100 or dev in unheard)):
                loading = mine or dev == host_id
                status = "loading" if loading else "idle"
                title = (f"Loading {progress[dev]}%" if dev in progress else "Loading") if loading else "Standing by"
                detail = f"layers {layers} · {_mb(used.get(dev))}" if mine else "no model is running yet"
            elif host is not None and host.recovering is not None:
                status, title, detail = "loading", "Re-dealing", reason
            elif mine:
                status, title = "serving", "Serving"
                detail = f"Layers {layers} · {_mb(used.get(dev))} · {model_name}"
            else:
                status, title, detail = "idle", "Not holding layers", "the model runs on the other devices"
            was = dev in first_stages  # held layers in the first deal: a lost worker stays a worker
            hops = list(self.hops_in.get(dev, ())) if mine else []
            devices.append({"id": dev, "name": d.get("name") or dev, "kind": d.get("kind", "computer"),
                            "lends": _mb(d.get("lends_bytes") or None), "role": "model host" if dev == host_id else
                            ("worker" if mine or (was and dev in srv.lost) else "guest"), "layers": layers, "status": status, "title": title,
                            "detail": detail, "why": why.get(dev, ""),
                            "tokens_handled": self.tokens_handled.get(dev, 0), "passes": self.passes.get(dev, 0),
                            "stage_ms": (1000 * self.compute_s.get(dev, 0.0) / self.stage_runs[dev]
                                         if mine and self.stage_runs.get(dev) else None),
                            "tokens_per_s": self.tokens_per_s(dev) if mine else None,
                            "layer_ms": (1000 * sum(one) / len(one) / (mine[0][1] - mine[0][0])
                                         if mine and (one := self.one_position_s.get(dev)) else None),
                            "hop_ms": 1000 * sum(h[1] for h in hops) / len(hops) if hops else None,
                            "hop_from": sorted({h[0] for h in hops}),
                            "hop_error_ms": 1000 * hops[-1][2] if hops else None,
                            "round_ms": lap_ms if mine and dev != host_id and len(workers) == 1 else None,
                            "shared_ms": lap_ms if mine and dev != host_id and len(workers) > 1 else None,
                            "shared_by": len(workers) if mine and dev != host_id and len(workers) > 1 else None})
        now = self.clock()
        recent = itertools.takewhile(lambda cv: now - cv[1]["seen"] <= CLIENT_SHOWN_S, reversed(self.clients.items()))
        clients = []  # one chip per kind: identical clients merge
        for c, v in sorted(itertools.islice(recent, MAX_CLIENTS_SHOWN)):
            kind = "guest" if c.startswith("guest:") else "api"
            chip = next((x for x in clients if x["kind"] == kind), None)
            if chip is None:
                chip = {"kind": kind, "count": 0, "questions": 0, "ids": []}
                clients.append(chip)
            chip["count"] += 1
            chip["questions"] += v["questions"]
            chip["ids"].append(c)
        return {"name": info.get("name"), "model": model_name, "model_id": srv.model_id, "guest": srv.guest_info,
                "tab": srv.tab_room.info() if getattr(srv, "tab_room", None) is not None else None,
                "ready": ready, "reason": reason or None,
                "phase": srv.phase, "host": host_id, "devices": devices, "clients": clients,
                "deal": {"stages": [{"device": x, "layers": f"{a + 1}-{b}"} for x, a, b in stages],
                         "notes": info.get("notes", [])},
                "predicted_tokens_per_s": info.get("predicted_tokens_per_s"),
                "measured_tokens_per_s": srv.last_tokens_per_s,
                "queue": {"waiting": len(host.queue) if host is not None else 0,
                          "answering": bool(host is not None and host.busy),
                          "in_flight": host.in_flight if host is not None else 0,
                          "in_flight_limit": srv.in_flight_limit()}}

    # -- HTTP ------------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.Response:
        """``GET /``: the room page."""
        return web.Response(body=(STATIC / "room.html").read_bytes(), content_type="text/html", charset="utf-8")

    def static(self, name: str, content_type: str):
        """A handler serving ``static/NAME``."""
        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=(STATIC / name).read_bytes(), content_type=content_type, charset="utf-8")
        return handler

    async def room(self, request: web.Request) -> web.Response:
        """``GET /api/room``: the snapshot."""
        return web.json_response(self.snapshot())

    async def events(self, request: web.Request) -> web.StreamResponse:
        """``GET /api/events``: server-sent events (module doc) until the client goes."""
        if len(self.subscribers) >= MAX_SUBSCRIBERS:
            return web.json_response({"error": "too many room pages open"}, status=503,
                                     headers={"Retry-After": "30"})
        q: asyncio.Queue = asyncio.Queue()
        self.subscribers.add(q)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
        try:
            await resp.prepare(request)
            item = {"event": "state", "data": self.snapshot()}
            while True:
                data = f"event: {item['event']}\ndata: {json.dumps(item['data'], separators=(',', ':'))}\n\n"
                await asyncio.wait_for(resp.write(data.encode()), 30.0)
                try:
                    item = await asyncio.wait_for(q.get(), 2.0)
                except asyncio.TimeoutError:
                    item = {"event": "state", "data": self.snapshot()}
        except (ConnectionError, asyncio.TimeoutError, RuntimeError):
            return resp
        finally:
            self.subscribers.discard(q)

