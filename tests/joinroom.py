"""A signalling relay on loopback for tests that start `splitroom join` processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterator

#: the splitroom CLI as a child process of this interpreter
SPLITROOM = [sys.executable, "-c", "from splitroom.cli import main; main()"]


@contextlib.contextmanager
def relay_room(room: str) -> Iterator[tuple[str, dict, list]]:
    """Start `splitroom relay` on a free loopback port; yield ``(room url, env, procs)``.

    Append every process the test starts to ``procs``: on exit each one still running
    (the relay included) is terminated, then killed after 5 s.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    relay = subprocess.Popen(SPLITROOM + ["relay", "--host", "127.0.0.1", "--port", "0"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
