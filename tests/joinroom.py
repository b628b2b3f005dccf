"""A signalling relay on loopback for tests that start `splitroom join` processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Iterator

def greedy_reference(prompt: str, max_new: int) -> list[int]:
    """The bundled model's greedy answer ids (eos dropped) from one process holding all
    30 layers: the independent reference a room's answer is compared with."""
    from runtime.backends import StageSpec, make_stage
    from runtime.generate import generate_greedy
    from runtime.tokenizer import ChatTokenizer
    from runtime.weights import ensure_safetensors
    model_dir = ensure_safetensors()
    whole = make_stage("numpy", model_dir, StageSpec(0, 30, host=True))
    ids = ChatTokenizer.from_dir(model_dir).encode_chat(prompt)
    return [t for t in generate_greedy([whole], ids, max_new).ids if t != 2]


#: the splitroom CLI as a child process of this interpreter
SPLITROOM = [sys.executable, "-c", "from splitroom.cli import main; main()"]


#: the splitroom CLI whose ICE consent is checked every 0.5 s instead of aioice's 5 s while
#: the file named by the environment variable QUICK_CONSENT_WHILE exists (a frozen peer's
#: connection then ends after 6 checks unanswered, seconds rather than about 30 s; only
#: then, so a busy start on a loaded machine is not taken for a dead peer), with the
#: transport's INFO lines shown (a connection that ends is logged at INFO)
QUICK_CONSENT_SPLITROOM = [sys.executable, "-c", """\
import logging, os, threading, time
import aioice.ice

def quick(path=os.environ.get("QUICK_CONSENT_WHILE")):
    while path:
        aioice.ice.CONSENT_INTERVAL = 0.5 if os.path.exists(path) else 5
        time.sleep(0.1)

threading.Thread(target=quick, daemon=True).start()
logging.getLogger("splitroom.transport").setLevel(logging.INFO)
from splitroom.cli import main; main()
"""]


#: a relay that seats every keyed hello without checking its proof (a hostile relay):
#: ``splitroom relay`` on 127.0.0.1 with ``runtime.relay.check_relay_hello`` always true
UNCHECKING_RELAY = [sys.executable, "-c", "import runtime.relay as r\nr.check_relay_hello = lambda *a: True\n"
                    "r.main('127.0.0.1', 0)"]


@contextlib.contextmanager
def relay_room(room: str, relay_argv: list[str] | None = None) -> Iterator[tuple[str, dict, list]]:
    """Start `splitroom relay` on a free loopback port (or ``relay_argv``, which prints
    the same "listening on" line); yield ``(room url, env, procs)``.

    Append every process the test starts to ``procs``: on exit each one still running
    (the relay included) is terminated, then killed after 5 s.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    argv = relay_argv or SPLITROOM + ["relay", "--host", "127.0.0.1", "--port", "0"]
    relay = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs = [relay]
    try:
        line = relay.stdout.readline()
        assert "listening on" in line, line
        yield line.split("listening on ")[1].strip().replace("/room/ROOM", f"/room/{room}"), env, procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=5)
        if relay.stdout:
            relay.stdout.close()


def read_until(proc: subprocess.Popen, text: str, timeout_s: float) -> str:
    """Read ``proc``'s text stdout character by character until it holds ``text`` (an
    answer streaming); returns what was read. Fails when the process ends first or
    ``timeout_s`` seconds pass."""
    out = ""
    t0 = time.monotonic()
    while text not in out:
        ch = proc.stdout.read(1)
        assert ch, f"the process ended before {text!r} was printed: {out[-200:]!r}"
        out += ch
        assert time.monotonic() - t0 < timeout_s, f"{text!r} not printed within {timeout_s} s"
    return out
