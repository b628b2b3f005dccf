"""The model host's HTTP server (aiohttp): an OpenAI-compatible chat API over the room.

Endpoints:

* ``POST /v1/chat/completions``: messages through the model's chat template,
  ``temperature`` / ``top_p`` / ``top_k`` / ``seed`` (greedy by default),
  ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``stream`` (server-sent events,
  one chunk per answer token, then ``[DONE]``), ``usage``, ``finish_reason``
  (``stop``: end of answer or a stop sequence; ``length``: the cap). Anything the room
  cannot honour: 400 naming the parameter (:mod:`runtime.serve.api`).
* ``GET /v1/models``: the model, only while the room is ready (every stage loaded its
  weights and connected, none lost: the host has heard every worker's node, which
  speaks only once its layers are loaded); an empty list otherwise.
* ``GET /metrics``: Prometheus text (prometheus_client, a registry of its own);
  ``splitroom_ready`` is worked out when scraped, by /health's rule; with
  ``splitroom_hop_seconds{src,dst}``: the hop time per link of the chain, from each
  device's stamps and its clock offset from the host's (planner/hops.py says exactly
  what a hop spans and how the offsets are estimated), and
  ``splitroom_hop_clock_error_seconds{src,dst}``: the bound on the last such hop's error.
* ``GET /health``: 200 when the room is ready, else 503 (a load balancer's rule), with
  ``ready``, the reason, the queue and the stages of the deal the room runs now; a room
  that answers but whose relay is gone says ``degraded`` ("relay lost: no device can
  join", :func:`watch_relay`).

Readiness: until the host's node is attached (its layers loaded and every device's data
channels open) and while its scheduler is stopped (a device lost for good) or re-dealing,
a chat request gets 503 at once, with the reason and ``Retry-After``.

The queue is the scheduler's (``decoding.questions_in_flight`` answers at once, one by
default; 10 waiting, 2 per asker): each
request is asked as a question whose asker is its client, ``api:key-<sha256 of the API
key, 16 hex>`` when it sends ``Authorization: Bearer KEY``, else ``api:<address>``. The
scheduler's refusal "queue full" or "already has 2 waiting" becomes 429 with
``Retry-After`` (waiting answers x the mean answer time so far). A client that goes away
(disconnects, or never reads) withdraws its question: its place is freed and the answer
being computed for it, if any, stops.

Every wait is bounded: a question waits at most ``queue_timeout_s`` for its turn and at
most ``stall_timeout_s`` between two tokens of its answer (then 503 and withdrawn); a
write to a client that does not read for ``write_timeout_s`` counts as a disconnect.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from planner.protocol import (AnswerDone, BeginAnswer, ChainReady, Computed, DeviceBack, DeviceLost, EmitToken,
                              FrameArrived, LapEnded, QuestionAsked, Redeal, Refuse, SendFrame)
from planner.hops import HopTimed, StageTimed
from planner.sampling import GREEDY

from ..control import Progress
from .api import (DEFAULT_MAX_TOKENS, ApiError, ChatRequest, StopMatcher, chunk_body, completion_body,
                  error_body, load_json, parse_chat_request, usage)

log = logging.getLogger("splitroom.serve")

#: seconds a client is told to wait while the room starts / after it lost a device
RETRY_STARTING_S = 5
RETRY_LOST_S = 30
#: mean answer time assumed before any was measured, seconds (for 429's Retry-After)
DEFAULT_ANSWER_S = 10.0
#: a new connection's request headers must arrive within this, seconds (then 408 and closed)
HEADER_TIMEOUT_S = 10.0
#: a request's body must arrive within this once its headers did, seconds (then 408)
BODY_TIMEOUT_S = 10.0
#: after an answer to a request whose body was not read, how long the rest is read and
#: thrown away before the connection closes, seconds (aiohttp's ``lingering_time``)
LINGER_S = 2.0
#: open connections one address may hold (more get 429 and are closed at once)
MAX_CONNECTIONS_PER_ADDRESS = 32


@dataclass
class _Ticket:
    """One HTTP request's question, fed by the node's observer."""

    question_id: int
    client: str
    items: asyncio.Queue = field(default_factory=asyncio.Queue)
    refused: Optional[str] = None
    ended: bool = False


class RoomServer:
    """The HTTP side of a served room (see module doc).

    Args:
        model_id: the id clients ask for (``model``) and ``/v1/models`` lists.
        room_info: JSON-ready facts about the room for ``/health`` and the room page
            (devices, the deal, the predicted tokens per second), or None.
        default_max_tokens: the answer cap when a request gives none (tokens; lowered to
            what the context leaves).
        queue_timeout_s: longest wait for a question's turn, seconds.
        stall_timeout_s: longest wait between two answer tokens, seconds.
        write_timeout_s: longest wait for a client to take a streamed chunk, seconds.
        header_timeout_s: a connection's first request headers must arrive within this,
            seconds (408, closed); an idle kept-alive connection is closed a little later.
        body_timeout_s: a request body must arrive within this after its headers, seconds (408).
        max_connections_per_address: connections one address may hold open (429 beyond).
    Attributes:
        app: the aiohttp application.
        node: the host's :class:`runtime.room.Node` once :meth:`attach` ed, else None.
    """

    def __init__(self, model_id: str, room_info: Optional[dict] = None, *,
                 default_max_tokens: int = DEFAULT_MAX_TOKENS, queue_timeout_s: float = 900.0,
                 stall_timeout_s: float = 120.0, write_timeout_s: float = 30.0,
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
                 clock: Callable[[], float] = time.monotonic):
        self.model_id = model_id
        self.room_info = dict(room_info or {})
        self.default_max_tokens = default_max_tokens
        self.queue_timeout_s = queue_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.write_timeout_s = write_timeout_s
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections_per_address = max_connections_per_address
        self.clock = clock
        self.node = None
        #: most questions answered at once before the node is attached (the room's
        #: configuration as dealt: planner.scheduler.host.in_flight_limit); once it is,
        #: the host scheduler's own (:meth:`in_flight_limit`)
        self.configured_in_flight = 1
        self.tokenizer = None
        self.phase = "starting"
        self.phase_reason = "the room is starting"
        #: devices lost and not back (a device that comes back, DeviceBack, leaves it)
        self.lost: list[str] = []
        #: the device the re-deal under way takes back (Redeal.back), or None
        self.redeal_back: Optional[str] = None
        self.tickets: dict[int, _Ticket] = {}
        #: where a browser guest connects (relay URL, room, desk id), or None
        self.guest_info: Optional[dict] = None
        #: where a tab that holds layers joins and gets its weights (runtime/serve/tab_stage.py), or None
        self.tab_room = None
        self._answer_s: list[float] = []  # recent answer durations, seconds
        self._begun: dict[int, float] = {}
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._lap_sent: dict[int, float] = {}
        self._lap_sum_s = 0.0
        self._lap_count = 0
        #: decode rate of the last answer, tokens per second (None before one)
        self.last_tokens_per_s: Optional[float] = None
        #: why the signalling relay cannot be reached (None: reachable or not watched);
        #: the room still answers, but no device can join (:func:`watch_relay`)
        self.relay_lost: Optional[str] = None
        self._metrics()
        self._header_timers: dict[Any, asyncio.TimerHandle] = {}  # transport -> its 408 until a request came
        self._per_address: dict[str, int] = {}
        self._address_of: dict[Any, str] = {}  # request handler -> its counted address
        self.app = web.Application(client_max_size=1 << 20, middlewares=[self._request_came])
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/metrics", self.metrics)
        self.app.router.add_get("/health", self.health)
        from .page import RoomPage
        self.page = RoomPage(self, clock)
        self.page.add_routes(self.app)
        from .tab_stage import add_tab_routes
        add_tab_routes(self.app, self)

    # -- state ------------------------------------------------------------------------

    def _metrics(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        r = self.registry = CollectorRegistry()
        self.m_ready = Gauge("splitroom_ready", "1 when /health says ready (every stage of the deal the room runs now loaded and "
                             "connected, not re-dealing, not stopped)",
                             registry=r)
        self.m_ready.set_function(lambda: 1 if self.readiness()[0] else 0)  # as /health says it when scraped
        self.m_waiting = Gauge("splitroom_queue_waiting", "questions waiting for their turn", registry=r)
        self.m_waiting.set_function(lambda: len(self._host().queue) if self._host() is not None else 0)
        self.m_answering = Gauge("splitroom_answering", "1 while a question is being answered", registry=r)
        self.m_answering.set_function(lambda: 1 if self._host() is not None and self._host().busy else 0)
        self.m_in_flight = Gauge("splitroom_questions_in_flight", "questions being answered at once", registry=r)
        self.m_in_flight.set_function(lambda: self._host().in_flight if self._host() is not None else 0)
        self.m_in_flight_limit = Gauge("splitroom_questions_in_flight_limit",
                                       "most questions answered at once (decoding.questions_in_flight, as dealt)",
                                       registry=r)
        self.m_in_flight_limit.set_function(self.in_flight_limit)
        self.m_questions = Counter("splitroom_questions", "questions that ended, by outcome", ["outcome"],
                                   registry=r)
        self.m_tokens = Counter("splitroom_tokens", "answer tokens emitted", registry=r)
        self.m_tps = Gauge("splitroom_tokens_per_second", "decode rate of the last answer (tokens after the "
                           "first / seconds between first and last)", registry=r)
        self.m_ttft = Histogram("splitroom_time_to_first_token_seconds", "question begun to first answer token",
                                registry=r, buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
        self.m_laps = Counter("splitroom_laps", "laps judged by the host (stale ones included)", registry=r)
        self.m_lap_s = Histogram("splitroom_lap_seconds", "host sends a lap's frame to the first worker until "
                                 "it comes back (every hop and worker stage of one lap)", registry=r,
                                 buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.m_http = Counter("splitroom_http_requests", "HTTP requests by endpoint and status",
                              ["endpoint", "status"], registry=r)
        self.m_lost = Counter("splitroom_devices_lost", "devices the room lost", registry=r)
        self.m_back = Counter("splitroom_devices_back", "lost devices that came back (said hello again)",
                              registry=r)
        self.m_out = Gauge("splitroom_devices_out", "devices lost and not back now", registry=r)
        self.m_out.set_function(lambda: len(self.lost))
        self.m_hop_s = Histogram("splitroom_hop_seconds", "one lap's frame from src handed to its transport to "
                                 "dst having it whole and checked, on the host's clock (each device's stamps, "
                                 "clock offsets from the heartbeats' NTP exchange)", ["src", "dst"], registry=r,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2))
        self.m_hop_error_s = Gauge("splitroom_hop_clock_error_seconds", "the last hop's bound on its error from "
                                   "the clock offsets (half the least heartbeat round trip of each end)",
                                   ["src", "dst"], registry=r)

    def _host(self):
        node = self.node
        return node.chain.host if node is not None else None

    def in_flight_limit(self) -> int:
        """Most questions the room answers at once: the host scheduler's, or while the
        room still starts (no node yet) the configured one (:attr:`configured_in_flight`)."""
        host = self._host()
        return host.questions_in_flight if host is not None else self.configured_in_flight

    def set_phase(self, phase: str, reason: str) -> None:
        """Before the node is attached: ``phase`` (``loading``, ``connecting``,
        ``stopping``, ``failed``) and the reason a chat request is told. ``stopping`` and
        ``failed`` end every open answer with an error (a streamed one gets an SSE error
        chunk, as OpenAI's clients expect, not a cut stream)."""
        self.phase, self.phase_reason = phase, reason
        if phase in ("stopping", "failed"):
            for t in self.tickets.values():
                if not t.ended:
                    t.items.put_nowait(("failed", reason))
        self.page.changed()

    def attach(self, node) -> None:
        """The host's node runs (layers loaded, every device connected): serve it."""
        self.node = node
        self.tokenizer = node.tokenizer
        node.observers.append(self._observe)
        self.phase, self.phase_reason = "serving", ""
        self.page.changed()

    def readiness(self) -> tuple[bool, str, Optional[int]]:
        """``(ready, reason when not, seconds to suggest in Retry-After)``; the seconds
        are None when the room failed for good (no Retry-After)."""
        host = self._host()
        if self.phase == "failed":
            return False, self.phase_reason, None  # waiting will not help: no Retry-After
        if self.phase != "serving" or host is None:
            return False, self.phase_reason, RETRY_STARTING_S
        if host.stopped:
            return False, f"the room lost a device and stopped: {host.stopped}", RETRY_LOST_S
        if host.recovering is not None:
            if self.redeal_back is not None:
                return False, f"re-dealing the layers: {self.redeal_back} came back", RETRY_STARTING_S
            who = ", ".join(self.lost) or "a device"
            return False, f"re-dealing the layers after {who} left", RETRY_STARTING_S
        liveness = getattr(self.node, "liveness", None)  # planner.liveness.Liveness of runtime.room.Node
        heard = liveness.last_heard if liveness is not None else None  # a worker speaks once loaded
        if heard is not None:
            progress = getattr(self.node, "progress", None) or {}  # a device loading says how far (Progress)
            waiting = [s.device for s in self.node.chain.deal.stages if s.device != self.node.cfg.host
                       and (s.device not in heard or progress.get(s.device, 100) < 100) and s.device not in self.lost]
            if waiting:
                return False, (f"the room is starting: waiting for {', '.join(waiting)} to load "
                               f"{'its' if len(waiting) == 1 else 'their'} layers"), RETRY_STARTING_S
        return True, "", 0

    def _observe(self, obj: Any) -> None:
        cls = type(obj)
        if cls is EmitToken:
            self.m_tokens.inc()
            now = self.clock()
            self._first.setdefault(obj.question_id, now)
            self._last[obj.question_id] = now
            self._count[obj.question_id] = self._count.get(obj.question_id, 0) + 1
            if obj.index == 0 and obj.question_id in self._begun:
                self.m_ttft.observe(now - self._begun[obj.question_id])
            t = self.tickets.get(obj.question_id)
            if t is not None:
                t.items.put_nowait(("token", obj.token))
        elif cls is SendFrame:
            if obj.src == getattr(self.node.cfg, "host", None) and obj.header.lap_id not in self._lap_sent:
                if len(self._lap_sent) > 1000:
                    self._lap_sent.clear()
                self._lap_sent[obj.header.lap_id] = self.clock()
                self.page.lap_sent(obj.header.tokens, obj.header.lap_id)
        elif cls is FrameArrived:
            t0 = self._lap_sent.pop(obj.header.lap_id, None)
            if t0 is not None and obj.device == self.node.cfg.host:
                self.m_lap_s.observe(self.clock() - t0)
                self._lap_sum_s += self.clock() - t0
                self._lap_count += 1
        elif cls is LapEnded:
            self.m_laps.inc()
        elif cls is Computed:
            self.page.computed(obj.device, obj.command, obj.seconds, obj.ref)
        elif cls is QuestionAsked:
            t = self.tickets.get(obj.question_id)
            if t is not None:
                t.items.put_nowait(("asked", None))
        elif cls is BeginAnswer:
            self._begun[obj.question_id] = self.clock()
            t = self.tickets.get(obj.question_id)
            if t is not None:
                t.items.put_nowait(("begin", None))
        elif cls is AnswerDone:
            self._ended(obj.question_id, "withdrawn" if obj.reason == "withdrawn" else "answered")
            t = self.tickets.get(obj.question_id)
            if t is not None:
                t.ended = True
                t.items.put_nowait(("done", obj.reason))
        elif cls is Refuse:
            self._ended(obj.question_id, "withdrawn" if obj.reason == "withdrawn by the asker" else "refused")
            t = self.tickets.get(obj.question_id)
            if t is not None:
                t.ended = True
                t.refused = obj.reason
                t.items.put_nowait(("refused", obj.reason))
        elif cls is DeviceLost:
            self.m_lost.inc()
            if obj.device not in self.lost:
                self.lost.append(obj.device)
        elif cls is DeviceBack:
            self.m_back.inc()
            if obj.device in self.lost:
                self.lost.remove(obj.device)
        elif cls is Redeal:
            self.redeal_back = obj.back or None
        elif cls is HopTimed:
            self.m_hop_s.labels(obj.src, obj.dst).observe(obj.seconds)  # below 0 only within error_s
            self.m_hop_error_s.labels(obj.src, obj.dst).set(obj.error_s)
            self.page.hop(obj)
            return
        elif cls is StageTimed:
            self.page.stage_timed(obj)
            return
        elif cls is Progress:  # a device's screen says "Loading N%" (page.py reads node.progress)
            pass
        elif cls is not ChainReady:  # ChainReady: the re-deal ended, the room may be ready again
            return
        self.page.changed()

    def _ended(self, qid: int, outcome: str) -> None:
        self.m_questions.labels(outcome).inc()
        begun = self._begun.pop(qid, None)
        first, last, n = self._first.pop(qid, None), self._last.pop(qid, None), self._count.pop(qid, 0)
        if outcome == "answered" and begun is not None:
            self._answer_s = (self._answer_s + [self.clock() - begun])[-20:]
            if n > 1 and last > first:
                self.last_tokens_per_s = (n - 1) / (last - first)
                self.m_tps.set(self.last_tokens_per_s)

    def lap_mean_s(self) -> Optional[float]:
        """Mean lap time the host measured (frame out to its return), seconds, or None."""
        return self._lap_sum_s / self._lap_count if self._lap_count else None

    def _retry_after_full(self) -> float:
        host = self._host()
        waiting = len(host.queue) if host is not None else 0
        mean = sum(self._answer_s) / len(self._answer_s) if self._answer_s else DEFAULT_ANSWER_S
        return max(1.0, mean * max(waiting, 1) / 2)

    # -- connections ----------------------------------------------------------------------

    def runner(self, **kwargs) -> web.AppRunner:
        """An AppRunner for :attr:`app` with the connection limits (class doc): aiohttp's
        ``keepalive_timeout`` closes an idle kept-alive connection, the server's own
        timer answers 408 to a connection whose first request headers are late, a body
        left unread is drained for at most :data:`LINGER_S`, and
        bad requests are logged one line each without their content
        (:class:`runtime.logs.OneLine`). Call :meth:`limit_connections` after its setup()."""
        from ..logs import one_line_logger
        return web.AppRunner(self.app, keepalive_timeout=self.header_timeout_s + 5.0, lingering_time=LINGER_S,
                             logger=one_line_logger("splitroom.serve.http"), **kwargs)

    def limit_connections(self, runner: web.AppRunner) -> None:
        """Count ``runner``'s connections per address (429 and closed beyond
        ``max_connections_per_address``) and start each one's header timer."""
        srv = runner.server
        made, lost = srv.connection_made, srv.connection_lost

        def connection_made(handler, transport) -> None:
            made(handler, transport)
            peer = transport.get_extra_info("peername")
            addr = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else "?"
            if self._per_address.get(addr, 0) >= self.max_connections_per_address:
                self._close_with(transport, 429, ApiError(
                    429, f"over {self.max_connections_per_address} connections from one address", None,
                    "rate_limit_exceeded", "rate_limit_error", RETRY_STARTING_S))
                return
            self._per_address[addr] = self._per_address.get(addr, 0) + 1
            self._address_of[handler] = addr
            self._header_timers[transport] = asyncio.get_running_loop().call_later(
                self.header_timeout_s, self._close_with, transport, 408, ApiError(
                    408, f"the request headers did not arrive within {self.header_timeout_s:g} s", None,
                    "request_timeout"))

        def connection_lost(handler, exc=None) -> None:
            addr = self._address_of.pop(handler, None)
            if addr is not None:
                self._per_address[addr] -= 1
                if not self._per_address[addr]:
                    del self._per_address[addr]
            timer = self._header_timers.pop(handler.transport, None) if handler.transport else None
            if timer is not None:
                timer.cancel()
            lost(handler, exc)

        srv.connection_made, srv.connection_lost = connection_made, connection_lost

    def _close_with(self, transport, status: int, e: ApiError) -> None:
        """Answer ``status`` before any request was read (no request object exists yet,
        so aiohttp cannot answer it) and close the connection."""
        self._header_timers.pop(transport, None)
        self.m_http.labels("connection", str(status)).inc()
        if transport.is_closing():
            return
        body = json.dumps(e.body()).encode()
        reason = {408: "Request Timeout", 429: "Too Many Requests"}[status]
        head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", f"Content-Length: {len(body)}",
                "Connection: close", *(f"{k}: {v}" for k, v in e.headers().items())]
        transport.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        transport.close()

    @web.middleware
    async def _request_came(self, request: web.Request, handler):
        timer = self._header_timers.pop(request.transport, None)
        if timer is not None:
            timer.cancel()
        return await handler(request)

    # -- HTTP ---------------------------------------------------------------------------

    @staticmethod
    def client_id(request: web.Request) -> str:
        """Who asks, for the queue's per-asker limit: ``api:key-<16 hex of sha256(KEY)>``
        for ``Authorization: Bearer KEY`` (the key itself is never kept), else
        ``api:<peer address>``."""
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and auth[7:].strip():
            return "api:key-" + hashlib.sha256(auth[7:].strip().encode()).hexdigest()[:16]
        return f"api:{request.remote or 'unknown'}"

    def _error(self, endpoint: str, e: ApiError) -> web.Response:
        self.m_http.labels(endpoint, str(e.status)).inc()
        return web.json_response(e.body(), status=e.status, headers=e.headers())

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: the model while the room is ready, else an empty list."""
        ready = self.readiness()[0]
        data = [{"id": self.model_id, "object": "model", "created": 0, "owned_by": "splitroom"}] if ready else []
        self.m_http.labels("models", "200").inc()
        return web.json_response({"object": "list", "data": data})

    def stages(self) -> list[dict]:
        """The stages of the deal the room runs now (after a re-deal, the new one):
        ``device``, ``start``, ``end`` (0-based half-open) and ``shown`` (1-based)."""
        deal = self.node.chain.deal if self.node is not None else None
        if deal is None:
            return list(self.room_info.get("stages") or [])
        return [{"device": s.device, "start": s.start, "end": s.end, "shown": s.shown} for s in deal.stages]

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: 200 when ready, else 503; the body has ``ready``, ``reason``,
        the queue (waiting, answering, the most questions one asker has waiting), the
        devices lost and not back, the stages of the deal the room runs now, and the room."""
        ready, reason, _ = self.readiness()
        host = self._host()
        status_word = "ready" if ready else ("starting" if self.phase != "serving" else "unavailable")
        if ready and self.relay_lost:
            status_word, reason = "degraded", f"relay lost: no device can join ({self.relay_lost})"
        body = {"status": status_word,
                "ready": ready, "reason": reason or None, "model": self.model_id,
                "queue": {"waiting": len(host.queue) if host is not None else 0,
                          "answering": bool(host is not None and host.busy),
                          "in_flight": host.in_flight if host is not None else 0,
                          "in_flight_limit": self.in_flight_limit(),
                          "most_waiting_of_one_asker": max(Tally(q.device for q in host.queue).values(),
                                                           default=0) if host is not None else 0},
                "lost": list(self.lost), "stages": self.stages(),
                "room": {**self.room_info, "stages": self.stages()}}
        status = 200 if ready else 503
        self.m_http.labels("health", str(status)).inc()
        return web.json_response(body, status=status)

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics``: Prometheus text format."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        self.m_http.labels("metrics", "200").inc()
        resp = web.Response(body=generate_latest(self.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (see module doc)."""
        try:
            try:
                raw = await asyncio.wait_for(request.read(), self.body_timeout_s)
            except asyncio.TimeoutError:
                resp = self._error("chat", ApiError(408, f"the request body did not arrive within "
                                                         f"{self.body_timeout_s:g} s", None, "request_timeout"))
                resp.force_close()
                return resp
            req = parse_chat_request(load_json(raw), self.model_id)
            ready, reason, retry = self.readiness()
            if not ready:
                raise ApiError(503, f"the room is not ready: {reason}", None, "room_not_ready",
                               "service_unavailable", retry)
            ids = await self._encode(req)
        except ApiError as e:
            return self._error("chat", e)
        except web.HTTPException:
            raise
        return await self._answer(request, req, ids)

    async def _encode(self, req: ChatRequest) -> list[int]:
        from runtime.tokenizer import TokenizerError
        loop = asyncio.get_running_loop()
        try:
            ids = await loop.run_in_executor(None, self.tokenizer.encode_chat, list(req.messages))
        except TokenizerError as e:
            raise ApiError(400, f"the messages cannot be put through the chat template: {e}", "messages") from None
        return ids

    def _cap(self, req: ChatRequest, prompt_len: int) -> int:
        """The answer's cap, tokens, checked against the room's context before anything
        keeps the prompt. Raises ApiError (400, ``messages`` or ``max_tokens``) when the
        prompt and the cap do not fit."""
        ctx = self.node.sched_cfg.context
        if req.max_tokens is not None:
            if ctx is not None and prompt_len + req.max_tokens > ctx:
                raise ApiError(400, f"the prompt is {prompt_len} tokens and max_tokens {req.max_tokens}; the "
                               f"room's context holds {ctx}", "messages" if prompt_len >= ctx else "max_tokens",
                               "context_length_exceeded")
            return req.max_tokens
        left = (ctx - prompt_len) if ctx is not None else self.default_max_tokens
        if left < 1:
            raise ApiError(400, f"the prompt is {prompt_len} tokens; the room's context holds {ctx}",
                           "messages", "context_length_exceeded")
        return min(self.default_max_tokens, left)

    def _refusal(self, reason: str) -> ApiError:
        """The scheduler's refusal as an HTTP error."""
        if reason.startswith("queue full") or "questions waiting" in reason:
            what = (f"the room's queue is full: {reason.removeprefix('queue full: ')}" if reason.startswith("queue full")
                    else f"the queue's limit for one asker: {reason}")
            return ApiError(429, what, None, "rate_limit_exceeded", "rate_limit_error", self._retry_after_full())
        if "does not fit the context" in reason:
            return ApiError(400, f"too long for the room's context: {reason}", "messages",
                            "context_length_exceeded")
        if reason.startswith("numerical fault"):  # a NaN/inf in a residual: the room's fault, not the request's
            return ApiError(500, f"the room failed the question: {reason}", None, "numerical_fault", "server_error")
        ready, why, retry = self.readiness()
        if not ready:
            return ApiError(503, f"the room cannot answer: {reason}", None, "room_not_ready",
                            "service_unavailable", retry)
        return ApiError(400, f"the room refused the question: {reason}", None, "refused")

    async def _answer(self, request: web.Request, req: ChatRequest, ids: list[int]) -> web.StreamResponse:
        node = self.node
        try:
            cap = self._cap(req, len(ids))
        except ApiError as e:
            return self._error("chat", e)
        client = self.client_id(request)
        self.page.client_seen(client)
        qid = node.ask(ids, cap, client, sampling=req.sampling or GREEDY)  # the request's own decoding
        ticket = self.tickets[qid] = _Ticket(qid, client)
        resp: Optional[web.StreamResponse] = None
        try:
            kind, _ = await asyncio.wait_for(ticket.items.get(), 30.0)  # "asked", on the loop's next turn
            if ticket.refused is not None:
                return self._error("chat", self._refusal(ticket.refused))
            if req.stream:
                resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                               "Cache-Control": "no-cache",
                                                               "X-Accel-Buffering": "no"})
                await resp.prepare(request)
                await self._send(resp, chunk_body(req, {"role": "assistant", "content": ""}))
            text, finish, n = await self._collect(req, ticket, resp)
            self.m_http.labels("chat", "200").inc()
            if resp is None:
                return web.json_response(completion_body(req, text, finish, len(ids), n))
            await self._send(resp, chunk_body(req, {}, finish))
            if req.include_usage:
                await self._send(resp, chunk_body(req, {}, usage_obj=usage(len(ids), n), no_choice=True))
            await self._write(resp, b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except ApiError as e:
            if resp is None:
                return self._error("chat", e)
            self.m_http.labels("chat", f"{e.status}-in-stream").inc()
            try:
                await self._send(resp, e.body())
                await resp.write_eof()
            except (ConnectionError, asyncio.TimeoutError, RuntimeError):
                pass
            return resp
        except (ConnectionError, asyncio.TimeoutError) as e:
            if resp is not None:
                # the client went away (closed the stream, even right after [DONE]) or stopped
                # reading: nothing more can reach it, and it is no error of the room's
                log.info("chat stream for %s ended by the client (%s)", client, type(e).__name__)
                return resp
            if isinstance(e, ConnectionError):
                raise
            # the "asked" echo never came: the node is not running
            return self._error("chat", ApiError(503, "the room did not take the question", None, "room_not_ready",
                                                "service_unavailable", RETRY_STARTING_S))
        finally:
            if not ticket.ended:
                node.withdraw(qid)  # the client went away, timed out, or hit a stop sequence
            self.tickets.pop(qid, None)
            asyncio.get_running_loop().call_later(1.0, node.forget, qid)

    async def answer_guest(self, body: Any, guest: str, write: Callable[[bytes], Awaitable[None]]) -> None:
        """A browser guest's question, asked over its WebRTC data channel (see
        :mod:`runtime.serve.guest`): ``body`` is a chat-completions request (streamed
        whatever it says) and ``guest`` the asker (the queue's limits count per guest).
        Everything is written with ``write`` as the HTTP stream would carry it
        (``data: {chunk}`` messages, then ``data: [DONE]``); a refusal or an error is one
        ``data: {"error": {..., "status": N}}`` message. Never raises for a bad body."""
        class _Target:  # what _send/_collect write to
            async def write(self, data: bytes) -> None:
                await write(data)
        target = _Target()

        async def fail(e: ApiError) -> None:
            body_ = e.body()
            body_["error"]["status"] = e.status
            if e.retry_after_s is not None:
                body_["error"]["retry_after"] = e.headers()["Retry-After"]
            self.m_http.labels("guest", str(e.status)).inc()
            await self._send(target, body_)

        try:
            req = parse_chat_request({**body, "stream": True} if isinstance(body, dict) else body, self.model_id)
            ready, reason, retry = self.readiness()
            if not ready:
                raise ApiError(503, f"the room is not ready: {reason}", None, "room_not_ready",
                               "service_unavailable", retry)
            ids = await self._encode(req)
            cap = self._cap(req, len(ids))
        except ApiError as e:
            await fail(e)
            return
        node = self.node
        self.page.client_seen(guest)
        qid = node.ask(ids, cap, guest, sampling=req.sampling or GREEDY)  # the request's own decoding
        ticket = self.tickets[qid] = _Ticket(qid, guest)
        try:
            await asyncio.wait_for(ticket.items.get(), 30.0)
            if ticket.refused is not None:
                raise self._refusal(ticket.refused)
            await self._send(target, chunk_body(req, {"role": "assistant", "content": ""}))
            _, finish, _ = await self._collect(req, ticket, target)
            await self._send(target, chunk_body(req, {}, finish))
            await self._write(target, b"data: [DONE]\n\n")
            self.m_http.labels("guest", "200").inc()
        except ApiError as e:
            await fail(e)
        except asyncio.TimeoutError:
            await fail(ApiError(503, "the room did not take the question", None, "room_not_ready",
                                "service_unavailable", RETRY_STARTING_S))
        finally:
            if not ticket.ended:
                node.withdraw(qid)
            self.tickets.pop(qid, None)
            asyncio.get_running_loop().call_later(1.0, node.forget, qid)

    async def _collect(self, req: ChatRequest, ticket: _Ticket,
                       resp: Optional[web.StreamResponse]) -> tuple[str, str, int]:
        """Wait for the answer's tokens; stream each as a chunk when ``resp``. Returns
        ``(text, finish_reason, answer tokens)``. Raises ApiError (503) for a refusal
        mid-answer or a wait past its bound, 500 for a numerical fault."""
        dec = self.tokenizer.stream_decoder()
        stop_ids = getattr(self.tokenizer, "stop_ids", frozenset())
        match = StopMatcher(req.stop)
        parts: list[str] = []
        n = 0
        begun = False
        while True:
            timeout = self.stall_timeout_s if begun else self.queue_timeout_s
            try:
                kind, val = await asyncio.wait_for(ticket.items.get(), timeout)
            except asyncio.TimeoutError:
                what = "between two tokens" if begun else "for its turn"
                raise ApiError(503, f"the room stalled: no progress in {timeout:.0f} s {what}", None,
                               "room_stalled", "service_unavailable", RETRY_LOST_S) from None
            if kind == "begin":
                begun = True
            elif kind == "token":
                begun = True
                n += 1
                piece = dec.push(val) if val not in stop_ids else ""
                out, stopped = match.push(piece)
                parts.append(out)
                if resp is not None:
                    await self._send(resp, chunk_body(req, {"content": out}))
                if stopped:
                    return "".join(parts), "stop", n
            elif kind == "done":
                tail, _ = match.push(dec.flush())
                tail += match.flush()
                parts.append(tail)
                if tail and resp is not None:
                    await self._send(resp, chunk_body(req, {"content": tail}))
                return "".join(parts), ("length" if val == "length" else "stop"), n
            elif kind == "failed":
                raise ApiError(503, f"the room failed mid-answer: {val}" if begun else f"the room cannot answer: {val}",
                               None, "room_not_ready", "service_unavailable", None)
            elif kind == "refused":
                raise self._refusal(val) if not begun or val.startswith("numerical fault") else ApiError(
                    503, f"the answer was cut off: {val}", None, "room_not_ready", "service_unavailable",
                    self.readiness()[2] or RETRY_LOST_S)

    async def _send(self, resp: web.StreamResponse, obj: dict) -> None:
        await self._write(resp, b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    async def _write(self, resp: web.StreamResponse, data: bytes) -> None:
        await asyncio.wait_for(resp.write(data), self.write_timeout_s)


async def watch_relay(server: RoomServer, relay_url: str, every_s: float = 2.0, timeout_s: float = 2.0) -> None:
    """Until cancelled, open a TCP connection to the relay of ``relay_url``
    (``ws://HOST:PORT``) every ``every_s`` seconds and set ``server.relay_lost`` to why
    it could not (refused, timed out), or back to None when it can. A joined room needs
    the relay only to seat devices, so its loss is logged once and /health says
    ``degraded``; nothing else changes."""
    from urllib.parse import urlsplit
    u = urlsplit(relay_url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    while True:
        why = None
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
            writer.close()
        except asyncio.TimeoutError:
            why = f"no answer from {host}:{port} in {timeout_s:g} s"
        except OSError as e:
            why = f"{host}:{port}: {e.strerror or type(e).__name__}"
        if why and not server.relay_lost:
            log.warning("relay lost: no device can join (%s)", why)
        elif not why and server.relay_lost:
            log.warning("relay reachable again: devices can join")
        server.relay_lost = why
        await asyncio.sleep(every_s)
