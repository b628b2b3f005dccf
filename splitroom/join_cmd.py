"""``splitroom join ROOM_URL``: one real machine's part of a room on a LAN.

Every machine runs ``splitroom join ws://RELAY:8765/room/NAME --device ID --peers ...``;
one of them with ``--host`` (the model host: tokenizer, embedding, the first layers,
output head; it asks the ``--ask`` questions). ``splitroom relay --host 0.0.0.0`` runs
the signalling relay on any one machine.

Layers are written as people write them: 1-based and inclusive, ``--layers 1-15`` is
the first fifteen layers (``[0, 15)`` in the code's 0-based half-open notation,
``--layers 16-30`` the other fifteen of SmolLM2-135M). ``--layers auto`` lets the host
deal the layers (:func:`planner.deal.deal`) over the devices that joined, from what
each one ``--lends``; every device of a room must then say ``auto``.

What happens (all peer to peer once connected; the relay only passes SDP):

1. each device connects to every peer (:func:`runtime.transport.connect_room`);
2. each sends every peer a :class:`runtime.control.Hello` on the ``reply`` channel
   (the control plane's typed messages, JSON on the wire):
   ``{"type": "hello", "device", "host": bool, "layers": [start, end] | null, "lends": bytes}``;
3. the host checks the ranges (or deals them) and sends every peer the :class:`~runtime.control.Plan`:
   ``{"type": "plan", "host", "stages": [[device, start, end], ...], "scheduler": {...},
   "max_new_tokens"}`` (or an ``Abort`` ``{"type": "abort", "reason"}``, and everyone exits
   with it); a malformed control message is logged and ignored;
4. each device that holds layers loads only its range and runs the device loop of
   ``splitroom run --real`` (:func:`runtime.node.run_device`: a :class:`runtime.room.Node`,
   the same router, scheduler and frames); residual frames that arrive while a device is
   still loading wait for it; a lost worker reaches the scheduler (the host re-deals its
   layers and replays the answer so far, or refuses what it cannot answer);
5. the host asks its questions one after another, prints each answer as it streams and
   then its speed, and finally sends ``{"type": "bye"}``; the others then exit.

Host gone: a worker that loses the model host says "Host reconnecting", keeps its
weights and waits ``--host-wait`` seconds (60 by default) for the host to join the
room again (``splitroom join ... --host`` once more: the relay gives them a new
connection); the handshake runs again, a worker dealt the same range keeps its loaded
weights (KV cache emptied), and the new host answers its questions. When the time
passes, every worker says "Room over" and exits with status 5.

Device back: a worker that loses a host that still runs (its Wi-Fi dropped) says hello
again over the live connection for ``--rejoin-live`` seconds (10 by default); past that
the host and the worker meet at the relay for a new connection
(:meth:`runtime.room.Node._meet_again`, :func:`await_host_plan`) and the worker says
hello over it. The host takes it back after the rejoin hold (planner/liveness.py) and
its rejoin rule may deal it back into the chain (a Replan); the worker keeps its weights
and its plan.

This module is the IO (the API, the connections, the control queue, the device loop);
the options are checked in :mod:`splitroom.join_options` and the handshake judged, with no
IO, in :mod:`splitroom.join_handshake`.

Exit status: 0 done, 2 bad arguments or a room that cannot be planned, 3 could not
join the room (or a peer was lost before the plan), 4 timed out, 5 room over (lost the
model host, which did not come back), 6 the host: a question was refused or not
answered (the reasons are printed).
"""

from __future__ import annotations

from runtime.threads import pin_one_blas_thread

pin_one_blas_thread()  # one BLAS thread per device process (as runtime.node), before numpy loads

import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Optional, Sequence, TextIO  # noqa: E402

from planner.deal import shown_layers as shown  # noqa: E402
from planner.model import BUNDLED_MODEL_ID, lookup  # noqa: E402
# the options check and the sans-IO handshake; their names stay importable from here (the CLI, the tests)
from splitroom.join_handshake import HostRound, Wait, from_host, model_spec, plan_room, scheduler_settings  # noqa: E402,F401
from splitroom.join_options import (  # noqa: E402,F401
    JoinError, JoinOptions, JoinSetup, check_options, parse_lends, parse_layers, parse_room_key, parse_room_url,
    room_decoding)

log = logging.getLogger("splitroom.join")

REFUSED = 6  # exit status of a host with a question not answered

CONTROL = "reply"  # the hello/plan/bye messages travel on the reply channel


# --------------------------------------------------------------------------- the IO of one device


class _Mux:
    """One handler for the transport: control messages (``reply`` channel, typed by
    :func:`runtime.control.parse_control`) go to a queue; everything else to the Node
    once it exists, and waits in order until then. Also stands in for the transport
    given to the Node (``send``, ``subscribe``, ``set_handler`` and ``set_lost_handler``):
    a lost peer reaches the Node, or, before the Node exists, the control queue as a lost
    marker."""

    def __init__(self, transport, key: Optional[str] = None):
        from runtime.control import ROOM_MESSAGES, ControlError, parse_control
        self._parse, self._error, self._room_messages = parse_control, ControlError, ROOM_MESSAGES
        self.t = transport
        #: the room key: a peer counts only once its hello proves it (runtime.control.check_proof)
        self.key = key
        self.verified: set[str] = set()
        self.refused: dict[str, str] = {}  # peer -> why its hello was refused
        #: the model host: the peer whose (proven) hello said ``host``, then the plan's host;
        #: only its plan, abort and bye count (:meth:`from_host`)
        self.host: Optional[str] = None
        self.control: asyncio.Queue = asyncio.Queue()
        self.node_handler = None
        self.lost_handler = None
        self.lost: dict[str, str] = {}
        self.early: list = []
        #: this device's Hello: said again over each new connection (:meth:`reconnect`), so a
        #: peer in a room with a key counts what this side sends over it
        self.hello = None
        transport.set_handler(self._on_message)
        if hasattr(transport, "set_lost_handler"):
            transport.set_lost_handler(self._on_lost)

    def _on_message(self, src: str, channel: str, data: bytes) -> None:
        if channel == CONTROL:
            try:
                msg = self._parse(data)
            except self._error as e:
                log.warning("control message from %s ignored: %s", src, e)
                return
            if self.key is not None and src not in self.verified:
                if msg.type != "hello":
                    return  # nothing from a peer counts before its hello proves the room key
                self._check_hello(src, msg)
                if src not in self.verified:
                    return
        elif self.key is not None and src not in self.verified:
            return
        if channel == CONTROL:
            if msg.type == "hello" and msg.host and self.host is None:
                self.host = src
            if isinstance(msg, self._room_messages):  # the running room's (runtime.control.ROOM_MESSAGES)
                if self.node_handler is not None:
                    self.node_handler(src, channel, data)
                return
            if msg.type == "hello" and self.node_handler is not None:  # a lost device back (runtime.room)
                self.node_handler(src, channel, data)
                return
            self.control.put_nowait((src, msg))
        elif self.node_handler is None:
            self.early.append((src, channel, data))
        else:
            self.node_handler(src, channel, data)

    def _check_hello(self, src: str, msg) -> None:
        """Count ``src`` as verified when its hello proves the room key over the DTLS
        certificate of its connection; otherwise refuse it (logged, and a marker wakes a
        device waiting for hellos or the plan)."""
        from runtime.control import check_proof
        if msg.device != src:
            why = f"its hello claims to be {msg.device!r}"
        else:
            fps = self.t.fingerprints(src) if hasattr(self.t, "fingerprints") else (None, None)
            why = check_proof(self.key, msg, fps[1])
        if why is None:
            self.verified.add(src)
            return
        log.warning("refused the hello of %s: %s", src, why)
        self.refused[src] = why
        self.control.put_nowait((src, None))

    def from_host(self, src: str, msg) -> bool:
        """Whether ``msg`` (a Plan, Abort or Bye) may be obeyed: it came over the
        connection of the model host (its id bound to its certificate by its hello's
        proof in a room with a key), and a plan names that host. Anything else is not."""
        return from_host(self.host, src, msg)

    def hello_for(self, peer: str, hello):
        """``hello`` as sent to ``peer``: with the proof of the room key over this side's
        certificate on that connection (unchanged without a room key)."""
        if self.key is None:
            return hello
        from runtime.control import room_proof
        local = self.t.fingerprints(peer)[0] if hasattr(self.t, "fingerprints") else None
        return hello.model_copy(update={"proof": room_proof(self.key, hello.device, local or "")})

    def _on_lost(self, peer: str, reason: str) -> None:
        self.lost[peer] = reason
        self.control.put_nowait((peer, None))  # wakes a device waiting for a hello or the plan
        if self.lost_handler is not None:
            self.lost_handler(peer, reason)

    # the Node's view of the transport
    def subscribe(self, channel: str, fn, accepts=None):
        """The transport's subscription to ``channel`` (runtime.transport.Transport.subscribe;
        the weights server's and a copy's), taking only messages from peers whose hello
        proved the room key (every peer's without a key); a message it does not take
        comes to this mux's handler, which drops what an unproven peer sent."""
        def proven(src: str, data: bytes) -> bool:
            return (self.key is None or src in self.verified) and (accepts is None or accepts(src, data))
        return self.t.subscribe(channel, fn, proven)

    def set_handler(self, fn) -> None:
        self.node_handler = fn
        early, self.early = self.early, []
        for m in early:
            fn(*m)

    def set_lost_handler(self, fn) -> None:
        self.lost_handler = fn
        for peer, reason in self.lost.items():
            fn(peer, reason)

    async def send(self, dst: str, channel: str, data: bytes) -> None:
        await self.t.send(dst, channel, data)

    async def reconnect(self, peer: str, timeout_s: float, offer: Optional[bool] = None) -> None:
        """A new connection to ``peer`` (see RtcTransport.reconnect; ``offer``: which side
        offers, None the smaller id); it is no longer lost."""
        self.verified.discard(peer)  # a new connection, a new certificate: its hello proves it again
        if offer is None:
            await self.t.reconnect(peer, timeout_s)
        else:
            await self.t.reconnect(peer, timeout_s, offer=offer)
        self.lost.pop(peer, None)
        if self.hello is not None and self.key is not None:
            await self.say(peer, self.hello_for(peer, self.hello))

    def next_round(self) -> None:
        """Forget the ended round's Node (its handlers and the messages meant for it) and
        every control message waiting: a new handshake follows."""
        self.node_handler = self.lost_handler = None
        self.early.clear()
        while not self.control.empty():
            self.control.get_nowait()

    async def say(self, dst: str, msg) -> None:
        """Send one typed control message (runtime.control) to ``dst``."""
        from runtime.control import encode_control
        await self.t.send(dst, CONTROL, encode_control(msg))



async def _next_control(mux: _Mux, want: tuple, deadline: float, what: str,
                        needed: Sequence[str] = ()) -> tuple:
    """The next control message of a type in ``want`` (runtime.control classes) as
    ``(src, message)``, judged by a :class:`splitroom.join_handshake.Wait`. Raises
    JoinError: status 4 at ``deadline`` (time.monotonic), 2 when the host aborts the
    room, 3 when a device in ``needed`` is lost or refused first. A plan, abort or bye
    from a peer that is not the model host (:meth:`_Mux.from_host`) is logged and
    ignored; so is an abort received by the host itself."""
    wait = Wait(want, what, tuple(needed))
    while True:
        wait.check_peers(mux.lost, mux.refused)
        left = deadline - time.monotonic()
        if left <= 0:
            raise wait.timed_out()
        try:
            src, msg = await asyncio.wait_for(mux.control.get(), left)
        except asyncio.TimeoutError:
            raise wait.timed_out() from None
        if msg is not None and wait.judge(src, msg, mux.host):  # None: a lost marker, checked at the top
            return src, msg


#: seconds the model host waits for every peer to answer its Bye (or for its connection
#: to end), and a worker that answered waits for the host to close: a hang guard against a
#: peer that never answers, not a delivery bound (a Bye on a working connection arrives,
#: however slowly; chosen, not measured)
BYE_WAIT_S = 30.0


async def say_bye(mux: _Mux, peers: Sequence[str], wait_s: float = BYE_WAIT_S) -> list[str]:
    """The model host is done: say Bye to every peer not lost, then wait until each has
    answered with its own Bye (it has the host's, :func:`answer_bye`) or its connection
    ended, at most ``wait_s`` seconds. Closing a connection drops what it has not sent
    yet, so only then may the host close its transport. Returns the peers that did
    neither in time (sorted); a peer the Bye cannot be sent to is not waited for."""
    from runtime.control import Bye
    from runtime.transport import TransportError
    waiting = set()
    for p in peers:
        if p in mux.lost:
            continue
        try:
            await mux.say(p, Bye())
        except TransportError:
            continue
        waiting.add(p)
    end = time.monotonic() + wait_s
    while True:
        waiting -= set(mux.lost)
        left = end - time.monotonic()
        if not waiting or left <= 0:
            return sorted(waiting)
        try:
            src, msg = await asyncio.wait_for(mux.control.get(), left)
        except asyncio.TimeoutError:
            continue
        if isinstance(msg, Bye):
            waiting.discard(src)


async def answer_bye(mux: _Mux, host: str, wait_s: float = BYE_WAIT_S) -> bool:
    """A worker had the model host's Bye: answer it with a Bye, then wait until the
    host's connection ends (the host closes once every peer answered: :func:`say_bye`),
    at most ``wait_s`` seconds, so this side's answer is not dropped by closing first.
    True when the host's connection ended in time."""
    from runtime.control import Bye
    from runtime.transport import TransportError
    try:
        await mux.say(host, Bye())
    except TransportError:
        return True  # its connection is already down
    end = time.monotonic() + wait_s
    while host not in mux.lost:
        left = end - time.monotonic()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(mux.control.get(), left)
        except asyncio.TimeoutError:
            pass
    return True


async def await_host_plan(mux: _Mux, host: str, wait_s: float, stop: Optional[asyncio.Event], say,
                          greet, reason: str = "it fell silent", running=None, live_s: float = 0.0,
                          hello=None):
    """A worker lost the model host ``host``: say "Host reconnecting", wait up to
    ``wait_s`` seconds for it to come back (:func:`runtime.node.await_host`: a new
    connection through the relay), say hello again (``greet()``) and take its plan. A
    host that restarted answers with its plan; the host that still runs (``running``:
    the plan of the round that ended), which lost this worker and met it at the relay,
    answers with its heartbeats: the same plan then goes on. With ``live_s`` > 0 (and
    ``running``), the first ``live_s`` seconds of the wait say ``hello`` (this device's
    :class:`runtime.control.Hello`, given its proof for ``host``) over the live
    connection (:func:`runtime.node.hello_again`): a host that answers over it still
    runs, and the same plan goes on. A device that connects as ``host`` but is refused
    (its hello cannot prove the room key over its certificate) or leaves before its plan
    is logged and the wait goes on, until the real host's plan or the end of ``wait_s``.

    Returns the host's :class:`runtime.control.Plan`. Raises JoinError (status 5, room
    over) when the wait ends without it; status 2 when the host aborts the room."""
    from runtime.control import Heartbeat, Plan
    from runtime.node import await_host, hello_again, host_reconnecting, shown_seconds
    until = time.monotonic() + wait_s
    announced = None  # "Host reconnecting" said already, for the whole wait
    live = min(live_s, wait_s)
    if running is not None and hello is not None and live > 0 and host not in mux.lost:
        say(host_reconnecting(host, wait_s))
        mux.next_round()
        if await hello_again(mux, host, hello.device, live, stop=stop, hello=mux.hello_for(host, hello)):
            say(f"the model host {host} answered on the live connection: rejoining the room")
            return running
        announced = wait_s
    while True:
        mux.next_round()
        if running is not None:  # the host's heartbeats reach a Node's handler (_Mux): into the queue, in order
            mux.set_handler(lambda src, channel, data: mux.control.put_nowait((src, Heartbeat()))
                            if src == host and _is_heartbeat(data) else None)
        left = max(until - time.monotonic(), 0.0)
        ok = await await_host(mux, host, left, stop, say, announced_s=announced)
        announced = None  # a later round (after a refused impostor) says it again
        if not ok:
            raise JoinError(f"room over: lost the model host {host} ({reason}) and it did not come back "
                            f"within {shown_seconds(wait_s)} s", 5)
        await greet()
        try:
            src, msg = await _next_control(mux, (Plan, Heartbeat) if running is not None else (Plan,), until,
                                           "the host's plan", [host])
            if isinstance(msg, Heartbeat):  # a restarted host sends its plan before its first heartbeat
                say(f"the model host {host} still runs: rejoining the room with the same plan")
                return running
            return msg
        except JoinError as e:
            if e.status == 4:
                raise JoinError(f"room over: the model host {host} did not send its plan within "
                                f"{shown_seconds(wait_s)} s", 5) from None
            if e.status != 3:
                raise
            why = mux.refused.pop(host, None)
            gone = mux.lost.pop(host, None)
            log.warning("refused a device connected as the model host %s: %s; still waiting for the host", host,
                        why or f"it left before its plan ({gone})")
            say(f"refused a device claiming to be the model host {host}; still waiting for it")


def stage_shares(model_dir, chain) -> list[dict]:
    """What the room page says each device of ``chain`` (``[[device, start, end], ...]``,
    0-based half-open) holds: ``[{"device", "used_bytes"}]``, the stored bytes of its
    layers' weights (runtime.weights_share.range_nbytes: the safetensors header, nothing
    hashed; the host's embedding and head not counted). Empty when the model directory
    cannot say (the page then says "size not known")."""
    from runtime.weights_share import range_nbytes
    try:
        return [{"device": d, "used_bytes": range_nbytes(model_dir, a, b)} for d, a, b in chain]
    except Exception as e:  # WeightsError, OSError: a directory without a safetensors file
        log.info("layer sizes not known for the room page: %s: %s", type(e).__name__, e)
        return []


def _is_heartbeat(data: bytes) -> bool:
    from runtime.control import ControlError, Heartbeat, parse_control
    try:
        return isinstance(parse_control(data), Heartbeat)
    except ControlError:
        return False


async def _stream_answers(node, tok, out: TextIO, opts: JoinOptions, queue=None, numbers=()) -> None:
    """Print each answer as its tokens arrive, then its length and speed; with a
    ``queue`` (splitroom.host_queue.HostQueue), write each question's end to it
    (``numbers[i]``: question i's number in the queue)."""
    qid = 0
    while qid < len(opts.asks):
        out.write(f"\n> {opts.asks[qid]}\n")
        out.flush()
        dec = tok.stream_decoder()
        seen = 0
        t_ask = time.perf_counter()
        t_first = t_last = None
        while True:
            ids = node.answers.get(qid, [])
            now = time.perf_counter()
            for t in ids[seen:]:
                t_first = now if t_first is None else t_first
                t_last = now
                if t not in tok.stop_ids:
                    piece = dec.push(t)
                    if piece:
                        out.write(piece)
            if len(ids) > seen:
                out.flush()
            seen = len(ids)
            if qid in node.ended and seen == len(node.answers.get(qid, [])):
                break
            await asyncio.sleep(0.005)
        out.write(dec.flush() + "\n")
        ids = node.answers.get(qid, [])
        n = len(ids)
        rate = (n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else 0.0
        ttft = (t_first - t_ask) if t_first is not None else float("nan")
        out.write(f"-- {n} tokens, {rate:.1f} tokens/s after the first, first token after {ttft:.2f} s"
                  f" ({node.ended[qid]})\n")
        out.flush()
        opts.answers.append({"prompt": opts.asks[qid], "text": tok.decode([t for t in ids if t not in tok.stop_ids]),
                             "token_ids": list(ids), "ended": node.ended[qid], "tokens_per_s": rate,
                             "ttft_s": ttft})
        if queue is not None:
            try:
                queue.end(numbers[qid], node.ended[qid])
            except Exception as e:  # a full disk must not stop the answers: said, not raised
                log.warning("the queue file was not updated: %s", e)
        qid += 1


async def _start_api(opts: JoinOptions, setup: JoinSetup, say):
    """``--serve``: the API up at once (503 with the reason until the room is ready), a
    browser tab's way in (TabRoom) and the relay watch. Returns ``(api, runner, watch)``
    (runtime.serve.host.start_api's pair and the watch's task), or None without ``--serve``.
    Raises JoinError (status 2) when the port cannot be listened on."""
    if opts.serve_port is None:
        return None
    relay_url, room, peers, ice_servers = setup.relay_url, setup.room, setup.peers, setup.ice_servers
    model_id, model_dir = setup.model_id, setup.model_dir
    import socket
    from runtime.serve.host import start_api
    try:
        sock = socket.create_server((opts.serve_bind, opts.serve_port))
    except OSError as e:
        raise JoinError(f"--serve {opts.serve_port}: cannot listen on {opts.serve_bind}: {e.strerror or e}") from None
    api = await start_api(sock, model_id)
    from runtime.serve.tab_stage import TabRoom  # a browser tab may join as a worker: share.html?layers=A-B
    api[0].tab_room = TabRoom(relay_url, room, opts.device, str(model_dir),
                              [s.for_webrtc() for s in ice_servers], opts.ice_relay_only)
    api[0].set_phase("connecting", f"the room is starting: waiting for {', '.join(peers)}")
    from runtime.serve.server import watch_relay
    api = (*api, asyncio.ensure_future(watch_relay(api[0], relay_url)))  # /health: degraded without it
    say(f"serving the API at http://{opts.serve_bind}:{sock.getsockname()[1]}/v1")
    return api


async def _connect(opts: JoinOptions, setup: JoinSetup, api, say):
    """Connect to every peer (runtime.transport.connect_room) and say which ICE servers and
    candidate pairs were used. Returns ``(transport, the ICE servers used)``. Raises
    JoinError (status 3) when the room cannot be joined (the API, if any, closed)."""
    from runtime.transport import TransportError, connect_room
    relay_url, room, peers, ice_servers, key = setup.relay_url, setup.room, setup.peers, setup.ice_servers, setup.key
    try:
        transport = await connect_room(relay_url, room, opts.device, peers,
                                       host_addresses=list(opts.addresses) or None,
                                       open_timeout_s=max(min(opts.timeout_s, 120.0), 1.0),
                                       ice_servers=ice_servers, relay_only=opts.ice_relay_only,
                                       ice_from_relay=opts.ice_from_relay, room_key=key)
    except (TransportError, OSError, asyncio.TimeoutError) as e:
        if api is not None:
            api[2].cancel()
            await api[1].cleanup()
        raise JoinError(f"could not join room {room!r}: {e}", 3) from None
    used = getattr(transport, "ice_servers", ice_servers)
    if used:
        say("ICE servers: " + ", ".join(s.redacted() for s in used)
            + (" (TURN credentials from the relay)" if opts.ice_from_relay and any(
                s.kind == "turn" for s in used if s not in ice_servers) else "")
            + (" (relay candidates only)" if opts.ice_relay_only else ""))
    for p in peers:
        pair = getattr(transport, "ice_pair", lambda _p: None)(p)
        if pair is not None:
            say(f"connected to {p} through ICE candidate pair {pair[0]} {pair[1]} -> {pair[2]} {pair[3]}")
    return transport, used


async def _open_desk(opts: JoinOptions, setup: JoinSetup, api, used, say):
    """The desk of browser guests (share.html) on a host serving the API, through the same
    relay; None without the API or when it cannot start (said; the API still serves)."""
    if api is None:
        return None
    relay_url, room = setup.relay_url, setup.room
    from runtime.serve.guest import GuestDesk
    desk = GuestDesk(api[0], relay_url, room, f"{opts.device}.desk", ice_servers=used,
                     relay_only=opts.ice_relay_only)
    try:
        await asyncio.wait_for(desk.start(), 10.0)
        api[0].guest_info = desk.info()
        say(f"browser guests: /share.html asks over WebRTC through {relay_url}")
    except Exception as e:  # the API still serves; only browser guests cannot join
        say(f"browser guests cannot join: {type(e).__name__}: {e}")
        await desk.close()
        desk = None
    return desk


async def _host_round(mux: _Mux, opts: JoinOptions, setup: JoinSetup, deadline: float):
    """The model host's handshake (:class:`splitroom.join_handshake.HostRound`): every
    peer's hello, then the Plan (or the Abort) sent to every peer. Returns ``(plan,
    hellos)``. Raises JoinError (status 2) after sending the Abort; as
    :func:`_next_control` while waiting."""
    from runtime.control import Abort, Hello
    peers = setup.peers
    rnd = HostRound(opts.device, peers, setup.mine, setup.lends)
    while not rnd.complete:
        src, msg = await _next_control(mux, (Hello,), deadline, "the other devices' hellos", peers)
        abort = rnd.hello(src, msg)
        if abort is not None:
            for p in peers:
                await mux.say(p, abort)
            raise JoinError(abort.reason)
    hellos = rnd.hellos
    plan = rnd.outcome(setup.room, setup.mcfg, opts.split, setup.decoding, setup.scn_seed, setup.model_id,
                       opts.max_new_tokens)
    for p in peers:
        await mux.say(p, plan)
    if isinstance(plan, Abort):
        raise JoinError(plan.reason)
    return plan, hellos


def _room_info(api, setup: JoinSetup, hellos: dict, host: str, chain: list) -> None:
    """What the room page shows (the host's hellos and the plan)."""
    model_id, mcfg, model_dir, room = setup.model_id, setup.mcfg, setup.model_dir, setup.room
    api[0].room_info.update({
        "name": room, "model": {"id": model_id,
                                "name": (lookup(BUNDLED_MODEL_ID).name if model_id == BUNDLED_MODEL_ID
                                         else mcfg.name),
                                "layers": mcfg.n_layers}, "host": host,
        "devices": [{"id": d, "name": d, "kind": "computer", "lends_bytes": (h or {}).get("lends")}
                    for d, h in hellos.items()],
        "stages": [{"device": d, "start": a, "end": b, "shown": shown(a, b)} for d, a, b in chain],
        "shares": stage_shares(model_dir, chain), "notes": [], "predicted_tokens_per_s": None})


async def join(opts: JoinOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Take part in the room (see module doc); returns the exit status.

    Raises JoinError for bad arguments, a room that cannot be joined or planned, and
    timeouts (its ``status`` is the exit status).
    """
    from runtime.control import Bye, Hello, NodeConfig, Plan
    from runtime.node import LOST_HOST, TIMED_OUT, load_device, run_device, stop_on_signals
    from runtime.transport import TransportError

    setup = check_options(opts)
    relay_url, room, key, peers = setup.relay_url, setup.room, setup.key, setup.peers
    queue, numbers, pending = setup.queue, setup.numbers, setup.pending
    decoding, model_dir, mine, lends = setup.decoding, setup.model_dir, setup.mine, setup.lends
    deadline = time.monotonic() + opts.timeout_s

    def say(line: str) -> None:
        print(f"[{opts.device}] {line}", file=err, flush=True)

    say(f"joining room {room!r} at {relay_url} with {', '.join(peers)}")
    if queue is not None and pending:
        say(f"resuming {len(pending)} question{'s' if len(pending) != 1 else ''} from the queue {opts.queue_file} "
            "that never ended")
    api = await _start_api(opts, setup, say)
    transport, used = await _connect(opts, setup, api, say)
    desk = await _open_desk(opts, setup, api, used, say)
    mux = _Mux(transport, key)
    if opts.host:
        mux.host = opts.device
    tab_weights = None
    if api is not None and key is None:  # a tab's range over its weights channel (TabRoom.serve); no tab
        tab_weights = api[0].tab_room.serve(transport)  # speaks a room key, so none is served then
    stop = stop_on_signals()
    kept = None  # a worker's ((start, end), loaded) kept while the host was away
    host = None
    hello = Hello(device=opts.device, host=bool(opts.host), layers=mine, lends=lends)
    mux.hello = hello

    async def greet() -> None:
        for p in peers:
            try:
                await mux.say(p, mux.hello_for(p, hello))
            except TransportError as e:  # a peer lost earlier: the host decides without it
                log.info("hello to %s not sent: %s", p, e)

    back = None  # the plan of a model host that came back
    try:
        while True:  # one round per model host: a worker waits for a host that left to come back
            if back is None:
                await greet()
            if back is not None:
                plan, back = back, None
            elif opts.host:
                plan, hellos = await _host_round(mux, opts, setup, deadline)
            else:
                _, plan = await _next_control(mux, (Plan,), deadline, "the host's plan", [host] if host else peers)
            chain = [list(s) for s in plan.stages]
            host = plan.host
            if api is not None:
                _room_info(api, setup, hellos, host, chain)
            say("plan: " + ", ".join(f"{d} layers {shown(a, b)}{' (host)' if d == host else ''}" for d, a, b in chain))
            members = [s[0] for s in chain]
            if opts.device not in members:
                say("dealt no layers: nothing to do here")
                return 0
            a, b = next((s[1], s[2]) for s in chain if s[0] == opts.device)
            is_host = opts.device == host
            spec = decoding.speculative if is_host and decoding is not None else None
            cfg = NodeConfig(device=opts.device, host=host, stages=chain, scheduler=plan.scheduler,
                             model_dir=str(model_dir), backend=opts.backend, prompts=list(opts.asks) if is_host else [],
                             max_new_tokens=plan.max_new_tokens, peers=[m for m in members if m != opts.device],
                             host_wait_s=opts.host_wait_s, rejoin_live_s=opts.rejoin_live_s,
                             slowdown=opts.slowdown, weights_from_peer=True, room_key=key,
                             heartbeat_timeout_s=opts.heartbeat_timeout_s,
                             drafter=spec.drafter if spec is not None else "ngram")
            if api is not None and is_host:  # /health and /metrics say it while the devices still load
                from planner.scheduler.host import in_flight_limit
                api[0].configured_in_flight = in_flight_limit(cfg.scheduler_config(), cfg.deal())
            if is_host:
                smp = plan.scheduler.sampling
                say(("greedy decoding" if smp.temperature == 0 else f"sampling: temperature {smp.temperature:g}, "
                     f"top_p {smp.top_p:g}, top_k {smp.top_k}, seed {smp.seed}")
                    + (f"; speculation: {spec.draft_tokens} tokens drafted by {spec.drafter}" if spec else ""))
            if kept is not None and kept[0] == (a, b) and kept[1][0] is not None:
                loaded = kept[1]
                loaded[0].rollback(0)  # the same weights, an empty KV cache
                how = "kept loaded while the host was away"
            else:
                loaded = load_device(cfg)
                how = opts.backend
            kept = None
            say(f"holding layers {shown(a, b)} ({how}); "
                + ("asking" if is_host else "serving until the host is done"))
            printer: list = []

            def stream(node) -> None:
                printer.append(asyncio.ensure_future(_stream_answers(node, loaded[1], out, opts, queue, numbers)))

            bye = None if is_host else asyncio.ensure_future(_next_control(mux, (Bye,), deadline, "the host's bye"))
            until = [] if bye is None else [bye]
            if api is not None:
                from runtime.serve.host import DEFAULT_LIFETIME_S
                node, status = await run_device(cfg, mux, DEFAULT_LIFETIME_S, stop, loaded=loaded,
                                                on_start=api[0].attach, keep_open=True)
            else:
                node, status = await run_device(cfg, mux, deadline - time.monotonic(), stop, until=until,
                                                loaded=loaded, on_start=stream if is_host else None)
            if status == TIMED_OUT:
                raise JoinError(f"timed out after {opts.timeout_s:.0f} s", 4)
            if status == LOST_HOST and not stop.is_set():
                reason = mux.lost.get(host, "it fell silent")
                wait = max(min(opts.host_wait_s, deadline - time.monotonic()), 0.0)
                kept = ((a, b), loaded)
                back = await await_host_plan(mux, host, wait, stop, say, greet, reason, plan,
                                             live_s=opts.rejoin_live_s, hello=hello)
                continue
            if is_host:
                if printer:  # the last answer's tail and speed line
                    try:
                        await asyncio.wait_for(printer[0], 0.0 if stop.is_set() else 10.0)
                    except asyncio.TimeoutError:
                        pass
                silent = await say_bye(mux, peers)  # closing before each peer has it would drop it
                if silent:
                    log.warning("no answer to the bye from %s within %g s; closing", ", ".join(silent), BYE_WAIT_S)
                if opts.answers_json:
                    with open(opts.answers_json, "w", encoding="utf-8") as f:
                        json.dump({"answers": opts.answers, "stages": chain}, f, indent=1)
                unanswered = [f"question {i + 1}: {e}" for i, e in sorted(node.ended.items()) if e != "answered"]
                if unanswered and api is None:
                    raise JoinError("not every question was answered: " + "; ".join(unanswered), REFUSED)
            elif bye is not None and bye.done() and not bye.cancelled() and bye.exception() is None:
                if not await answer_bye(mux, host):
                    log.info("%s did not close within %g s of this device's answer to its bye", host, BYE_WAIT_S)
            return 0
    finally:
        if desk is not None:
            await desk.close()
        if tab_weights is not None:
            tab_weights.close()
        await transport.close()
        if api is not None:
            api[2].cancel()
            api[0].set_phase("stopping", "the room is shutting down")
            api[0].node = None
            await api[1].cleanup()


def run_join(opts: JoinOptions) -> int:
    """Run :func:`join` in a fresh event loop; JoinError propagates (the CLI prints it)."""
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    return asyncio.run(join(opts))
