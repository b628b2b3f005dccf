"""A device process: ``python -m runtime.node CONFIG.json RELAY_URL ROOM``, and the one
device loop (:func:`run_device`) that it and ``splitroom join`` share.

Loads only its layer range (the host also the embedding, head and tokenizer), joins the
room through the signalling relay, serves until the host has asked every question (the
host), until it is told to stop (SIGTERM or SIGINT, or the host's ``bye`` in ``join``),
or until it loses the model host (workers), then writes its JSONL trace to
``config.trace_path``. BLAS threads are pinned to one per process so that devices
sharing this machine's cores share them fairly.

A worker that loses the model host keeps its weights and waits ``host_wait_s`` (60 s
by default) for it to come back ("Host reconnecting": :func:`await_host` makes a new
connection to it through the relay); a host that returns resumes the room, its KV cache
emptied; otherwise "Room over" and exit status 5.

Exit status: 0 done, 2 bad configuration, 3 could not join the room, 4 timed out,
5 lost the model host (the room is over: it did not come back in time).
"""

from __future__ import annotations

from .threads import pin_one_blas_thread

pin_one_blas_thread()  # one BLAS thread per device process, before numpy loads

import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Awaitable, Callable, Optional, Sequence  # noqa: E402

from .backends import StageSpec, make_stage  # noqa: E402
from .control import REJOIN_LIVE_S, ControlError, NodeConfig  # noqa: E402
from .room import Node  # noqa: E402

log = logging.getLogger("splitroom.node")

DONE, BAD_CONFIG, NO_ROOM, TIMED_OUT, LOST_HOST = 0, 2, 3, 4, 5


#: the model host's process creates ``config.trace_path`` + this (empty) once it has joined
#: the room, every device connected: ``run --real`` tells a death while loading by it
JOINED_SUFFIX = ".joined"

#: KV positions of a device whose scheduler settings give no context
DEFAULT_MAX_CTX = 2048


def load_device(cfg: NodeConfig, max_ctx: int | None = None):
    """Load what ``cfg.device`` computes with: ``(stage or None, tokenizer or None,
    drafter or None)``. The stage holds only the device's range (the host's also the
    embedding and head), with a KV cache of ``max_ctx`` positions: by default the room's
    context (the scenario's ``context``, carried in the scheduler settings; the planner
    counts the KV cache at it), :data:`DEFAULT_MAX_CTX` when the settings have none. The
    host gets the tokenizer, and its drafter when the scheduler drafts. Raises
    OSError/ValueError from the weights (missing files, bad range)."""
    if max_ctx is None:
        max_ctx = cfg.scheduler.context or DEFAULT_MAX_CTX
    mine = [s for s in cfg.stages if s[0] == cfg.device]
    is_host = cfg.device == cfg.host
    stage = tokenizer = drafter = None
    if mine or is_host:
        a, b = (mine[0][1], mine[0][2]) if mine else (0, 0)
        stage = make_stage(cfg.backend, cfg.model_dir, StageSpec(a, b, host=is_host), max_ctx=max_ctx,
                           precision=cfg.precision())
        stage.warm_up(lap_rows(cfg.scheduler))
    if is_host:
        from .tokenizer import ChatTokenizer
        tokenizer = ChatTokenizer.from_dir(cfg.model_dir)
        if cfg.scheduler.draft_tokens:
            from .drafters import make_drafter
            drafter = make_drafter(cfg.drafter, cfg.model_dir, cfg.early_exit_layers)
            drafter.warm_up()
    return stage, tokenizer, drafter


def lap_rows(sched) -> tuple[int, ...]:
    """The row counts of the frames a room with scheduler settings ``sched``
    (:class:`planner.scheduler.SchedulerConfig`) sends: a prefill chunk, a verify lap
    (draft tokens + 1; with ``draft_tokens: auto`` the longest) and a decode step (1).
    What :meth:`runtime.backends.base.Stage.warm_up` runs once."""
    return tuple(sorted({1, int(sched.prefill_chunk), int(sched.draft_tokens or 0) + 1}))


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (in the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def run_device(cfg: NodeConfig, transport, timeout_s: float, stop: Optional[asyncio.Event] = None,
                     until: Sequence[Awaitable] = (), loaded=None,
                     on_start: Optional[Callable[[Node], None]] = None,
                     keep_open: bool = False, append_trace: bool = False) -> tuple[Node, int]:
    """The one device loop (``python -m runtime.node`` and ``splitroom join``).

    Builds a :class:`runtime.room.Node` over ``transport`` (``send``/``set_handler``/``subscribe``,
    optionally ``set_lost_handler``), starts it, and waits until the host has asked and
    ended every question, ``stop`` is set, any of ``until`` finishes (a worker's "the
    host said bye"), a worker loses the host, or ``timeout_s`` seconds pass. Then stops
    the node and writes its trace (and the host's answers) when ``cfg.trace_path`` is set.

    Args:
        loaded: ``(stage, tokenizer, drafter)`` already loaded; :func:`load_device` when None.
        on_start: called with the started node (e.g. to stream its answers).
        keep_open: the host keeps taking questions (``Node.ask``, e.g. from an HTTP
            server) once its configured prompts are answered, until ``stop``, an
            ``until`` waiter or the timeout.
        append_trace: append to ``cfg.trace_path`` (a later round of the same device,
            after the host came back) instead of replacing it.
    Returns:
        ``(node, status)``: status 0 done, 4 timed out, 5 lost the model host. An
        exception raised by an ``until`` waiter propagates after the node is stopped.
    """
    stage, tokenizer, drafter = loaded if loaded is not None else load_device(cfg)
    kwargs = {"drafter": drafter} if drafter is not None else {}
    node = Node(cfg, stage, transport, tokenizer, keep_open=keep_open, **kwargs)
    is_host = cfg.device == cfg.host
    node.start()
    if on_start is not None:
        on_start(node)
    waiters = [asyncio.ensure_future(w) for w in until]
    if stop is not None:
        waiters.append(asyncio.ensure_future(stop.wait()))
    waiters.append(asyncio.ensure_future(node.done.wait() if is_host else node.lost_host.wait()))
    status = DONE
    try:
        done, pending = await asyncio.wait(waiters, timeout=max(timeout_s, 0.0), return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        if not done:
            log.error("%s: timed out after %.0f s", cfg.device, timeout_s)
            status = TIMED_OUT
        elif not is_host and node.lost_host.is_set():
            log.error("%s: lost the model host %s", cfg.device, cfg.host)
            status = LOST_HOST
        for d in done:
            d.result()  # an until-waiter's error (e.g. the host aborted the room)
    finally:
        await node.stop()
        if cfg.trace_path:
            _write_outputs(cfg, node, tokenizer, append_trace)
    return node, status


async def hello_again(transport, host: str, device: str, live_s: float, beat_s: float = 0.25,
                      stop: Optional[asyncio.Event] = None, hello=None) -> bool:
    """Say Hello to ``host`` every ``beat_s`` over the connection for up to ``live_s``
    seconds (a model host that lost this device takes it back: it sends heartbeats again,
    and re-deals it back when its rule says). True when anything from ``host`` arrives
    meanwhile; False when nothing did, or ``stop`` was set. ``hello``: the
    :class:`runtime.control.Hello` to send (``join``'s, with its proof of the room key);
    default a bare one naming ``device``. The transport's handler is this function's
    while it waits (the next device round sets its own)."""
    from .control import Hello, encode_control
    from .room import REPLY
    heard = asyncio.Event()
    transport.set_handler(lambda src, channel, data: heard.set() if src == host else None)
    msg = encode_control(hello if hello is not None else Hello(device=device))
    end = time.monotonic() + live_s
    while time.monotonic() < end and not (stop is not None and stop.is_set()):
        try:
            await transport.send(host, REPLY, msg)
        except Exception:  # TransportError, a closed channel: nothing to say hello on
            return False
        try:
            await asyncio.wait_for(heard.wait(), beat_s)
            return True
        except asyncio.TimeoutError:
            continue
    return heard.is_set()


async def worker_rounds(cfg: NodeConfig, transport, timeout_s: float, stop: asyncio.Event, loaded,
                        live_s: Optional[float] = None) -> int:
    """A worker's device rounds over ``transport``: :func:`run_device`; when it loses the
    model host, Hello again over the live connection for ``live_s`` seconds (default
    ``cfg.rejoin_live_s``; :func:`hello_again`: the host still runs and takes it back),
    else :func:`await_host` (a new connection through the relay, made with a host that
    restarted or with the same host, which meets a lost worker there) and Hello again
    over it; each new round keeps the weights, its KV cache emptied. Returns the last
    round's exit status."""
    live_s = cfg.rejoin_live_s if live_s is None else live_s
    t0 = time.monotonic()
    rounds = 0
    while True:
        _, status = await run_device(cfg, transport, timeout_s - (time.monotonic() - t0), stop,
                                     loaded=loaded, append_trace=rounds > 0)
        rounds += 1
        if status != LOST_HOST or stop.is_set():
            return status
        left = min(cfg.host_wait_s, timeout_s - (time.monotonic() - t0))
        live = min(live_s, max(left, 0.0))
        if live > 0:
            log.warning("%s", host_reconnecting(cfg.host, max(left, 0.0)))
        if live > 0 and await hello_again(transport, cfg.host, cfg.device, live, stop=stop):
            log.warning("%s: the model host %s answered on the live connection: rejoining the room",
                        cfg.device, cfg.host)
        elif not await await_host(transport, cfg.host, max(left - live, 0.0), stop,
                                  announced_s=max(left, 0.0) if live > 0 else None):
            return status
        elif not await hello_again(transport, cfg.host, cfg.device, max(min(REJOIN_LIVE_S, left), 0.25), stop=stop):
            log.warning("%s: the model host %s said nothing over the new connection", cfg.device, cfg.host)
        if loaded[0] is not None:
            loaded[0].rollback(0)  # same weights, empty KV cache: the host replays what it needs


def shown_seconds(s: float) -> str:
    """Seconds as a person reads them: to a tenth, without a trailing ``.0`` (what is
    left of a 3 s wait, 2.99999 s, is ``3``; 0.5 is ``0.5``; 86400 is ``86400``)."""
    text = f"{s:.1f}"
    return text[:-2] if text.endswith(".0") else text


def host_reconnecting(host: str, wait_s: float) -> str:
    """The "Host reconnecting" line a worker says the moment it loses the model host
    ``host`` and waits up to ``wait_s`` seconds for it (:func:`shown_seconds`)."""
    return (f"Host reconnecting: lost the model host {host}; keeping the weights, waiting up to "
            f"{shown_seconds(wait_s)} s")


async def await_host(transport, host: str, wait_s: float, stop: Optional[asyncio.Event] = None,
                     say: Callable[[str], None] = lambda line: log.warning("%s", line),
                     announced_s: float | None = None) -> bool:
    """A worker lost the model host ``host``: say "Host reconnecting" and wait up to
    ``wait_s`` seconds for it to come back (``transport.reconnect(host, timeout_s)``: a
    new connection through the relay, made when the host's new process joins the room).
    ``announced_s``: the worker said "Host reconnecting" already, waiting up to that
    many seconds in all (the first of them on the live connection, :func:`hello_again`):
    the line is not said again, and "Room over" names that whole wait.

    Returns True when the host is connected again; False (after saying "Room over")
    when ``wait_s`` passed, ``stop`` was set, or the transport cannot reconnect.
    Never raises for a failed reconnection."""
    from .transport import TransportError
    if announced_s is None:
        say(host_reconnecting(host, wait_s))
    if wait_s > 0 and hasattr(transport, "reconnect"):
        attempt = asyncio.ensure_future(transport.reconnect(host, wait_s))
        waiters = [attempt] + ([asyncio.ensure_future(stop.wait())] if stop is not None else [])
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters[1:]:
                w.cancel()
        if attempt.done() and not attempt.cancelled():
            e = attempt.exception()
            if e is None:
                say(f"{host} is back: resuming the room")
                return True
            if not isinstance(e, (TransportError, OSError, ValueError)):
                log.warning("reconnecting to %s failed: %s: %s", host, type(e).__name__, e)
        else:
            attempt.cancel()
            try:
                await attempt
            except (asyncio.CancelledError, Exception):
                pass
            say("Room over: stopped while waiting for the model host")
            return False
    waited = shown_seconds(wait_s if announced_s is None else announced_s)
    say(f"Room over: the model host {host} did not come back within {waited} s")
    return False


def _write_outputs(cfg: NodeConfig, node: Node, tokenizer, append: bool = False) -> None:
    with open(cfg.trace_path, "a" if append else "w", encoding="utf-8") as f:
        for rec in node.trace_records():
            f.write(json.dumps(rec) + "\n")
    if tokenizer is not None:
        answers = {qid: tokenizer.decode(ids) for qid, ids in node.answers.items()}
        with open(cfg.trace_path + ".answers.json", "w", encoding="utf-8") as f:
            json.dump({"answers": {str(k): {"text": answers[k], "token_ids": node.answers[k]}
                                   for k in node.answers},
                       "ended": {str(k): v for k, v in node.ended.items()},
                       "rejected_frames": node.rejected_frames}, f)


def apply_emulated_delay(cfg: NodeConfig, transport) -> None:
    """Hold every packet ``transport`` sends ``cfg.emulate_one_way_s`` seconds in this
    process (runtime.transport.emulate_delay) when that is above 0, and log it; nothing
    otherwise. ``transport``: the connected room's RtcTransport."""
    if cfg.emulate_one_way_s > 0:
        from .transport import emulate_delay
        emulate_delay(transport, cfg.emulate_one_way_s)
        log.info("%s: every packet it sends waits %.1f ms in this process (emulated delay)", cfg.device,
                 cfg.emulate_one_way_s * 1000)


async def serve(cfg: NodeConfig, relay_url: str, room: str, timeout_s: float = 600.0,
                stop: Optional[asyncio.Event] = None) -> int:
    """Run one device of ``splitroom run --real`` until done; returns the exit status
    (see module doc). ``stop``: an event that ends it (SIGTERM/SIGINT's when None)."""
    from .transport import TransportError, connect_room

    loaded = load_device(cfg)
    try:
        transport = await connect_room(relay_url, room, cfg.device, cfg.peers, room_key=cfg.room_key,
                                       **cfg.ice())
    except (TransportError, OSError, asyncio.TimeoutError) as e:
        log.error("%s: could not join room %s: %s", cfg.device, room, e)
        return NO_ROOM
    apply_emulated_delay(cfg, transport)
    if cfg.trace_path and cfg.device == cfg.host:  # tells run --real the room started
        with open(cfg.trace_path + JOINED_SUFFIX, "w", encoding="utf-8"):
            pass
    stop = stop_on_signals() if stop is None else stop
    try:
        if cfg.device == cfg.host:
            _, status = await run_device(cfg, transport, timeout_s, stop, loaded=loaded)
        else:
            status = await worker_rounds(cfg, transport, timeout_s, stop, loaded)
    finally:
        await transport.close()
        write_delay_stats(cfg, transport)
    return status


#: beside a device's trace: what its in-process delay did (RtcTransport.delay_stats, JSON)
DELAY_SUFFIX = ".delay.json"


def write_delay_stats(cfg: NodeConfig, transport) -> None:
    """Write ``transport``'s in-process delay record to ``cfg.trace_path + DELAY_SUFFIX``
    when it has one and the node keeps a trace."""
    stats = getattr(transport, "delay_stats", lambda: None)()
    if stats is not None and cfg.trace_path:
        with open(cfg.trace_path + DELAY_SUFFIX, "w", encoding="utf-8") as f:
            json.dump(stats, f)


async def serve_colocated(cfgs: Sequence[NodeConfig], relay_url: str, room: str, timeout_s: float = 600.0) -> int:
    """Run several devices of one machine in this process: ``cfgs[0]`` (the model host)
    and the stages it also runs (ends-local privacy: its tail ``<host>.tail``, see
    planner/privacy.py). Each is its own :class:`runtime.room.Node` with its own
    connections; they share this process's event loop and its one BLAS thread, as two
    stages share one machine. When the first ends, the others are stopped (SIGTERM or
    SIGINT stops all). Returns the first one's exit status."""
    stop = stop_on_signals()
    first = asyncio.ensure_future(serve(cfgs[0], relay_url, room, timeout_s, stop))
    others = [asyncio.ensure_future(serve(c, relay_url, room, timeout_s, stop)) for c in cfgs[1:]]
    try:
        status = await first
    finally:
        stop.set()
        await asyncio.gather(*others, return_exceptions=True)
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point; argv: CONFIG.json RELAY_URL ROOM [TIMEOUT_S] [--also CONFIG2.json ...]
    (``--also``: another device this process runs beside the first, see
    :func:`serve_colocated`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    also = []
    while "--also" in argv:
        i = argv.index("--also")
        if i + 1 >= len(argv):
            print("--also needs a CONFIG.json", file=sys.stderr)
            return BAD_CONFIG
        also.append(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) < 3:
        print("usage: python -m runtime.node CONFIG.json RELAY_URL ROOM [TIMEOUT_S] [--also CONFIG2.json ...]",
              file=sys.stderr)
        return BAD_CONFIG
    cfgs = []
    for path in [argv[0]] + also:
        try:
            with open(path, encoding="utf-8") as f:
                cfgs.append(NodeConfig.from_json(f.read()))
        except (OSError, ControlError, ValueError) as e:
            print(f"{path}: bad node configuration: {e}", file=sys.stderr)
            return BAD_CONFIG
    try:
        timeout_s = float(argv[3]) if len(argv) > 3 else 600.0
    except ValueError as e:
        print(f"bad timeout: {e}", file=sys.stderr)
        return BAD_CONFIG
    if len(cfgs) == 1:
        return asyncio.run(serve(cfgs[0], argv[1], argv[2], timeout_s))
    return asyncio.run(serve_colocated(cfgs, argv[1], argv[2], timeout_s))


if __name__ == "__main__":
    sys.exit(main())
