"""``splitroom join`` on 127.0.0.1 with three devices: the worker holding the middle
layers is killed (SIGKILL) while the host streams its answer. The host notices by
heartbeat, gives the lost layers to the stage before them (itself), loads them from
disk, replays, and the answer is token for token the single-process answer; the last
worker follows the new plan and leaves when the host says bye."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.joinroom import SPLITROOM, greedy_reference, read_until, relay_room

pytestmark = pytest.mark.slow

PROMPT = "List the numbers from 1 to 30, separated by commas."
MAX_NEW = 60


def test_a_joined_worker_killed_mid_answer_the_host_answers_like_one_process(tmp_path: Path):
    want = greedy_reference(PROMPT, MAX_NEW)

    with relay_room("recovery") as (url, env, procs):
        common = ["--address", "127.0.0.1", "--timeout", "90"]
        w1 = subprocess.Popen(SPLITROOM + ["join", url, "--device", "w1", "--layers", "11-20", "--peers", "h,w2"]
                              + common, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        w2 = subprocess.Popen(SPLITROOM + ["join", url, "--device", "w2", "--layers", "21-30", "--peers", "h,w1"]
                              + common, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        answers = tmp_path / "answers.json"
        host = subprocess.Popen(SPLITROOM + ["join", url, "--device", "h", "--host", "--layers", "1-10", "--peers",
                                             "w1,w2", "--ask", PROMPT, "--max-tokens", str(MAX_NEW),
                                             "--answers-json", str(answers)] + common,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs += [w1, w2, host]
        read_until(host, "1, 2, 3", 80)  # the answer is streaming: kill the middle worker now
        os.kill(w1.pid, signal.SIGKILL)
        rest, h_err = host.communicate(timeout=90)
        w2_out, w2_err = w2.communicate(timeout=15)
        assert host.returncode == 0, h_err
        assert w2.returncode == 0, w2_err
    got = json.loads(answers.read_text())
    (a,) = got["answers"]
    assert [t for t in a["token_ids"] if t != 2] == want and a["ended"] == "answered"
    assert "lost w1" in h_err
