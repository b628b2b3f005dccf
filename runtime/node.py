"""A device process: ``python -m runtime.node CONFIG.json RELAY_URL ROOM``.

Loads only its layer range (the host also the embedding, head and tokenizer), joins the
room through the signalling relay, serves until the host has asked every question (the
host) or until it is told to stop (SIGTERM or SIGINT: workers), then writes its JSONL
trace to ``config.trace_path``. BLAS threads are pinned to one per process so that
devices sharing this machine's cores share them fairly.

Exit status: 0 done, 2 bad configuration, 3 could not join the room, 4 timed out.
"""

from __future__ import annotations

import os

# one BLAS thread per device process (set before numpy loads)
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from .backends import StageSpec, make_stage  # noqa: E402
from .room import Node, NodeConfig  # noqa: E402

log = logging.getLogger("splitroom.node")


async def serve(cfg: NodeConfig, relay_url: str, room: str, timeout_s: float = 600.0) -> int:
    """Run one device until done; returns the exit status (see module doc)."""
    from .transport import TransportError, connect_room

    stage = None
    tokenizer = None
    mine = [s for s in cfg.stages if s[0] == cfg.device]
    is_host = cfg.device == cfg.host
    if mine or is_host:
        a, b = (mine[0][1], mine[0][2]) if mine else (0, 0)
        stage = make_stage(cfg.backend, cfg.model_dir, StageSpec(a, b, host=is_host), max_ctx=2048)
    if is_host:
        from .tokenizer import ChatTokenizer
        tokenizer = ChatTokenizer.from_dir(cfg.model_dir)
    try:
        transport = await connect_room(relay_url, room, cfg.device, cfg.peers)
    except (TransportError, OSError, asyncio.TimeoutError) as e:
        log.error("%s: could not join room %s: %s", cfg.device, room, e)
        return 3
    kwargs = {}
    if is_host and cfg.scheduler.get("draft_tokens"):
        from .drafters import make_drafter
        kwargs["drafter"] = make_drafter(cfg.drafter, cfg.model_dir, cfg.early_exit_layers)
    node = Node(cfg, stage, transport, tokenizer, **kwargs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    node.start()
    status = 0
    try:
        waiters = [asyncio.ensure_future(stop.wait())]
        if is_host:
            waiters.append(asyncio.ensure_future(node.done.wait()))
        done, pending = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for p in pending:
            p.cancel()
        if not done:
            log.error("%s: timed out after %.0f s", cfg.device, timeout_s)
            status = 4
    finally:
        await node.stop()
        if cfg.trace_path:
            with open(cfg.trace_path, "w", encoding="utf-8") as f:
                for rec in node.trace_records():
                    f.write(json.dumps(rec) + "\n")
        if is_host and tokenizer is not None:
            answers = {qid: tokenizer.decode(ids) for qid, ids in node.answers.items()}
            with open(cfg.trace_path + ".answers.json", "w", encoding="utf-8") as f:
                json.dump({"answers": {str(k): {"text": answers[k], "token_ids": node.answers[k]}
                                       for k in node.answers},
                           "ended": {str(k): v for k, v in node.ended.items()},
                           "rejected_frames": node.rejected_frames}, f)
        await transport.close()
    return status


def main(argv: list[str] | None = None) -> int:
    """Entry point; argv: CONFIG.json RELAY_URL ROOM [TIMEOUT_S]."""
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if len(argv) < 3:
        print("usage: python -m runtime.node CONFIG.json RELAY_URL ROOM [TIMEOUT_S]", file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            cfg = NodeConfig.from_json(f.read())
    except (OSError, TypeError, ValueError) as e:
        print(f"{argv[0]}: bad node configuration: {e}", file=sys.stderr)
        return 2
    timeout_s = float(argv[3]) if len(argv) > 3 else 600.0
    return asyncio.run(serve(cfg, argv[1], argv[2], timeout_s))


if __name__ == "__main__":
    sys.exit(main())
