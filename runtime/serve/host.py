"""The model host's process of a served room:
``python -m runtime.serve CONFIG.json RELAY_URL ROOM (--listen-fd N | --port P) [options]``.

The HTTP server is up first (chat requests get 503 "starting" with the reason), then the
host loads its layers (in a thread: HTTP keeps answering), joins the room through the
relay and waits until every device's data channels are open (each device loads its
layers before it connects), then serves questions from HTTP until SIGTERM or SIGINT.
``--listen-fd`` takes a listening TCP socket made by the parent (``splitroom serve``
binds it in its own network namespace, so the API stays on this machine's address while
the host process runs in an emulated network's namespace).

Exit status: 0 stopped by a signal, 2 bad arguments or configuration, 3 could not join
the room, 4 the configured lifetime ran out.
"""

from __future__ import annotations

from ..threads import pin_one_blas_thread

pin_one_blas_thread()  # as runtime.node, before numpy loads

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
from typing import Awaitable, Optional, TypeVar  # noqa: E402

from aiohttp import web  # noqa: E402

from planner.model import BUNDLED_MODEL_ID  # noqa: E402
from planner.scheduler.host import in_flight_limit  # noqa: E402

from ..control import ControlError, NodeConfig  # noqa: E402
from ..node import (BAD_CONFIG, DONE, NO_ROOM, apply_emulated_delay, load_device, run_device,  # noqa: E402
                    stop_on_signals)
from .server import RoomServer  # noqa: E402

log = logging.getLogger("splitroom.serve")
T = TypeVar("T")

#: default lifetime of a served room, seconds (30 days; ``--lifetime`` changes it)
DEFAULT_LIFETIME_S = 30 * 86400.0


async def _unless_stopped(aw: Awaitable[T], stop: asyncio.Event) -> Optional[T]:
    """``await aw``, or None (``aw`` cancelled) if ``stop`` is set first."""
    task = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass
    return None


async def start_api(sock: socket.socket, model_id: str, room_info: Optional[dict] = None,
                    server: Optional[RoomServer] = None) -> tuple[RoomServer, web.AppRunner]:
    """Start the HTTP API on the listening ``sock`` at once (chat requests get 503 until
    :meth:`RoomServer.attach`); returns ``(server, runner)``; ``await runner.cleanup()``
    ends it. Used by :func:`serve_host` and ``splitroom join --host --serve PORT``."""
    server = server or RoomServer(model_id, room_info)
    runner = server.runner(handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    server.limit_connections(runner)
    await web.SockSite(runner, sock).start()
    return server, runner


async def serve_host(cfg: NodeConfig, relay_url: str, room: str, sock: socket.socket, model_id: str,
                     room_info: Optional[dict] = None, open_timeout_s: float = 120.0,
                     lifetime_s: float = DEFAULT_LIFETIME_S, stop: Optional[asyncio.Event] = None,
                     server: Optional[RoomServer] = None, guests: bool = False) -> int:
    """Run the model host of a served room until ``stop`` (default: SIGTERM/SIGINT).

    Args:
        cfg: the host's NodeConfig (``cfg.device == cfg.host``).
        relay_url, room: where the devices meet (``ws://ADDR:PORT``, room name).
        sock: a listening TCP socket for the HTTP API.
        model_id: the id the API serves.
        room_info: facts for ``/health`` (devices, deal, prediction).
        open_timeout_s: how long every device gets to load its layers and connect, seconds.
        lifetime_s: the room ends after this long, seconds.
        server: a RoomServer to use (tests); one is made otherwise.
        guests: also take browser guests over WebRTC through the relay
            (:class:`runtime.serve.guest.GuestDesk`; the relay must be reachable by them).
    Returns:
        the exit status (module doc).
    Raises:
        ValueError: ``cfg`` is not the model host's configuration.
    """
    from ..transport import TransportError, connect_room

    if cfg.device != cfg.host:
        raise ValueError(f"{cfg.device} is not the model host ({cfg.host}); only the host serves HTTP")
    server, runner = await start_api(sock, model_id, room_info, server)
    server.configured_in_flight = in_flight_limit(cfg.scheduler_config(), cfg.deal())  # while the room starts
    stop = stop or stop_on_signals()
    loop = asyncio.get_running_loop()
    transport = None
    desk = None
    relay_watch = None
    status = DONE
    try:
        server.set_phase("loading", "the room is starting: the model host is loading its layers")
        loaded = await _unless_stopped(loop.run_in_executor(None, load_device, cfg), stop)
        if loaded is None:
            return DONE
        server.tokenizer = loaded[1]
        others = ", ".join(cfg.peers) or "nobody"
        server.set_phase("connecting", f"the room is starting: waiting for {others} to load their layers "
                         "and connect")
        try:
            transport = await _unless_stopped(
                connect_room(relay_url, room, cfg.device, cfg.peers, open_timeout_s=open_timeout_s,
                             room_key=cfg.room_key, **cfg.ice()),
                stop)
        except (TransportError, OSError, asyncio.TimeoutError) as e:
            log.error("%s: could not join room %s: %s", cfg.device, room, e)
            server.set_phase("failed", f"the room could not start: {e}")
            return NO_ROOM
        if transport is None:
            return DONE
        apply_emulated_delay(cfg, transport)
        log.warning("%s: every device connected; serving", cfg.device)
        from .server import watch_relay
        relay_watch = asyncio.ensure_future(watch_relay(server, relay_url))
        if guests:
            from .guest import GuestDesk
            desk = GuestDesk(server, relay_url, room, f"{cfg.host}.desk", **cfg.ice())
            try:
                await asyncio.wait_for(desk.start(), 10.0)
                server.guest_info = desk.info()
            except Exception as e:  # the API still serves; only browser guests cannot join
                log.error("%s: browser guests cannot join: %s", cfg.device, e)
                desk = None
        _, status = await run_device(cfg, transport, lifetime_s, stop, loaded=loaded, on_start=server.attach,
                                     keep_open=True)
    finally:
        if relay_watch is not None:
            relay_watch.cancel()
        server.set_phase("stopping", "the room is shutting down")
        server.node = None
        if desk is not None:
            await desk.close()
        if transport is not None:
            await transport.close()
        await runner.cleanup()
    return status


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point (see module doc)."""
    p = argparse.ArgumentParser(prog="python -m runtime.serve", description="The model host of a served room.")
    p.add_argument("config")
    p.add_argument("relay_url")
    p.add_argument("room")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--listen-fd", type=int, help="a listening TCP socket inherited from the parent")
    g.add_argument("--port", type=int, help="listen on this TCP port (with --bind)")
    p.add_argument("--bind", default="127.0.0.1", help="address for --port (default 127.0.0.1)")
    p.add_argument("--model-id", default=BUNDLED_MODEL_ID)
    p.add_argument("--room-info", help="a JSON file of room facts for /health and the room page")
    p.add_argument("--open-timeout", type=float, default=120.0)
    p.add_argument("--lifetime", type=float, default=DEFAULT_LIFETIME_S)
    p.add_argument("--guests", action="store_true", help="take browser guests over WebRTC through the relay")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        with open(args.config, encoding="utf-8") as f:
            cfg = NodeConfig.from_json(f.read())
        info = None
        if args.room_info:
            with open(args.room_info, encoding="utf-8") as f:
                info = json.load(f)
        if args.listen_fd is not None:
            sock = socket.socket(fileno=args.listen_fd)
        else:
            sock = socket.create_server((args.bind, args.port))
        if not (args.open_timeout > 0 and args.lifetime > 0):
            raise ValueError("--open-timeout and --lifetime must be more than 0 seconds")
    except (OSError, ControlError, ValueError) as e:
        print(f"runtime.serve: {e}", file=sys.stderr)
        return BAD_CONFIG
    return asyncio.run(serve_host(cfg, args.relay_url, args.room, sock, args.model_id, info,
                                  args.open_timeout, args.lifetime, guests=args.guests))
