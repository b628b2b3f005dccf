"""The model host's process is killed (SIGKILL, by pid) while it streams an answer in a
``splitroom join`` room on 127.0.0.1. The worker says "Host reconnecting" and keeps
its weights; a host started again within the wait resumes the room with its queue (the
worker keeps its loaded layers; the new host, given the same ``--queue`` file and no
question, asks the one that never ended, and its answer is token for token the
single-process greedy answer); a host that does not come back ends the room: the worker says "Room
over" and exits with status 5 once the wait (2 s here, 60 s by default) has passed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.joinroom import SPLITROOM, UNCHECKING_RELAY, greedy_reference, read_until, relay_room

pytestmark = pytest.mark.slow

PROMPT = "List the numbers from 1 to 30, separated by commas."
MAX_NEW = 16


class Lines:
    """A child's text stream read line by line in a thread (so a test can wait for a
    line while the child runs)."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._t.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def wait_for(self, text: str, timeout_s: float) -> float:
        """Seconds (time.monotonic) when a line holding ``text`` was seen; fails after ``timeout_s``."""
        t0 = time.monotonic()
        while not any(text in ln for ln in self.lines):
            assert time.monotonic() - t0 < timeout_s, f"no line with {text!r} in {timeout_s} s: {self.lines[-5:]}"
            time.sleep(0.05)
        return time.monotonic()

    def text(self) -> str:
        self._t.join(timeout=5)
        return "".join(self.lines)


def _host(url: str, env: dict, answers: Path | None = None, queue: Path | None = None,
          ask: bool = True, cli: list[str] = SPLITROOM) -> subprocess.Popen:
    argv = cli + ["join", url, "--device", "h", "--host", "--layers", "1-15", "--peers", "w",
                        "--max-tokens", str(MAX_NEW), "--address", "127.0.0.1", "--timeout", "50"]
    if ask:
        argv += ["--ask", PROMPT]
    if answers is not None:
        argv += ["--answers-json", str(answers)]
    if queue is not None:
        argv += ["--queue", str(queue)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _worker(url: str, env: dict, wait_s: float, live: tuple[str, ...] = ("--rejoin-live", "0")
            ) -> tuple[subprocess.Popen, Lines]:
    """The worker; ``live``: its --rejoin-live (0 by default: the host is killed, not
    frozen, so its hellos over the dead connection would only add to the wait)."""
    w = subprocess.Popen(SPLITROOM + ["join", url, "--device", "w", "--layers", "16-30", "--peers", "h",
                                      "--address", "127.0.0.1", "--timeout", "55", "--host-wait", str(wait_s)]
                         + list(live),
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return w, Lines(w.stderr)


def _kill_while_streaming(host: subprocess.Popen) -> None:
    read_until(host, "1, 2", 40)  # the answer is streaming: the host goes away now
    os.kill(host.pid, signal.SIGKILL)
    host.wait(timeout=5)


def test_a_host_that_comes_back_resumes_the_room_with_the_worker_weights_kept(tmp_path: Path):
    want = greedy_reference(PROMPT, MAX_NEW)
    queue = tmp_path / "queue.jsonl"
    with relay_room("hostback") as (url, env, procs):
        worker, w_err = _worker(url, env, 30)
        first = _host(url, env, queue=queue)
        procs += [worker, first]
        _kill_while_streaming(first)
        w_err.wait_for("Host reconnecting", 10)
        # the question is taken (on disk) and never ended: the host that comes back asks it
        assert [json.loads(x) for x in queue.read_text().splitlines()] == [{"asked": 0, "prompt": PROMPT}]
        answers = tmp_path / "answers.json"
        again = _host(url, env, answers, queue=queue, ask=False)  # no --ask: the queue's question
        procs.append(again)
        _, h_err = again.communicate(timeout=50)
        assert again.returncode == 0, h_err
        assert worker.wait(timeout=15) == 0
        log = w_err.text()
    assert "resuming 1 question from the queue" in h_err
    got = json.loads(answers.read_text())
    (a,) = got["answers"]
    assert a["prompt"] == PROMPT
    assert [t for t in a["token_ids"] if t != 2] == want and a["ended"] == "answered"
    assert "h is back" in log and "kept loaded while the host was away" in log
    assert log.count("holding layers 16-30") == 2  # once loaded, once kept
    assert [json.loads(x) for x in queue.read_text().splitlines()][1:] == [{"ended": 0, "how": "answered"}]


def test_a_host_that_does_not_come_back_ends_the_room_after_the_wait():
    with relay_room("hostgone") as (url, env, procs):
        worker, w_err = _worker(url, env, 2, live=())  # the default: the whole 2 s on the live connection
        host = _host(url, env)
        procs += [worker, host]
        _kill_while_streaming(host)
        t_kill = time.monotonic()
        seen_at_kill = len(w_err.lines)  # the worker's lines read so far: all written before the kill
        w_err.wait_for("Host reconnecting", 10)
        rc = worker.wait(timeout=20)
        t_end = time.monotonic()
        log = w_err.text()
    assert rc == 5, log
    assert "Room over" in log and "did not come back within 2 s" in log
    assert "Traceback" not in log
    # the worker says it is reconnecting only after the host is gone: no such line before the
    # kill, one after it (noticed by heartbeat, 1 s of silence, within wait_for's 10 s); then
    # the 2 s wait, then a clean exit within worker.wait's 20 s
    lines = w_err.lines
    assert not any("Host reconnecting" in ln for ln in lines[:seen_at_kill]), lines[:seen_at_kill]
    assert any("Host reconnecting" in ln for ln in lines[seen_at_kill:])
    assert t_end - t_kill >= 2.0


#: ``splitroom`` whose relay hello carries the tag in $IMPOSTOR_TAG (a tag is public: the
#: relay logs it) instead of its own key's: it gets past a relay that does not check proofs
IMPOSTOR = [sys.executable, "-c", "import os, runtime.relay as r\nmade = r.relay_hello\n"
            "r.relay_hello = lambda *a: {**made(*a), 'room_tag': os.environ['IMPOSTOR_TAG']}\n"
            "from splitroom.cli import main\nmain()"]


def test_an_impostor_host_while_the_host_is_away_is_refused_and_the_room_resumes(tmp_path: Path):
    """A keyed room whose relay seats without checking (hostile): while the host is away,
    a device without the key takes the host's id and says hello as the host. The worker
    refuses it (its proof over the DTLS certificate does not match), keeps waiting, and
    the real host coming back resumes the room with the greedy answer."""
    from runtime.relay import room_tag
    want = greedy_reference(PROMPT, MAX_NEW)
    key, other = "k" * 32, "x" * 32
    queue = tmp_path / "queue.jsonl"
    with relay_room("impostor", UNCHECKING_RELAY) as (url, env, procs):
        worker, w_err = _worker(f"{url}?key={key}", env, 60)
        first = _host(f"{url}?key={key}", env, queue=queue)
        procs += [worker, first]
        _kill_while_streaming(first)
        w_err.wait_for("Host reconnecting", 10)
        imp = _host(f"{url}?key={other}", dict(env, IMPOSTOR_TAG=room_tag(key, "impostor")), cli=IMPOSTOR)
        procs.append(imp)
        w_err.wait_for("refused a device connected as the model host h", 60)
        os.kill(imp.pid, signal.SIGKILL)
        imp.wait(timeout=5)
        assert worker.poll() is None  # still waiting for the host
        answers = tmp_path / "answers.json"
        again = _host(f"{url}?key={key}", env, answers, queue=queue, ask=False)
        procs.append(again)
        _, h_err = again.communicate(timeout=60)
        assert again.returncode == 0, h_err
        assert worker.wait(timeout=15) == 0
        log = w_err.text()
    (a,) = json.loads(answers.read_text())["answers"]
    assert [t for t in a["token_ids"] if t != 2] == want and a["ended"] == "answered"
    refused = [ln for ln in log.splitlines() if "refused a device connected as the model host h" in ln]
    assert refused and all("still waiting" in ln for ln in refused), log
    assert "h is back" in log and "Traceback" not in log
