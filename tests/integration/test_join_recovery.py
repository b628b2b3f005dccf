"""``splitroom join`` on 127.0.0.1 with three devices: a worker is killed (SIGKILL)
while the host streams its answer. The host notices by heartbeat and gives the lost
layers to the stage before them: the middle worker's to the host itself, which loads
them from disk; the last worker's to the middle worker, which copies them from the host
over the weights channel. The room replays and the answer is token for token the
single-process answer; the surviving worker follows the new plan and leaves when the
host says bye."""

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


# the middle worker lost: its layers go to the stage before them, the host, which reads
# them from its disk; the last worker lost: its two layers go to the middle worker, which
# copies them from the host over the weights channel (packed, every tensor checked)
LAYOUTS = {"w1": ("1-10", "11-20", "21-30"), "w2": ("1-10", "11-28", "29-30")}


@pytest.mark.parametrize("lose", ["w1", "w2"])
def test_a_joined_worker_killed_mid_answer_the_host_answers_like_one_process(tmp_path: Path, lose: str):
    want = greedy_reference(PROMPT, MAX_NEW)
    h_layers, w1_layers, w2_layers = LAYOUTS[lose]
    survivor = "w2" if lose == "w1" else "w1"

    with relay_room("recovery") as (url, env, procs):
        common = ["--address", "127.0.0.1", "--timeout", "90"]
        workers = {}
        for dev, layers, peers in (("w1", w1_layers, "h,w2"), ("w2", w2_layers, "h,w1")):
            workers[dev] = subprocess.Popen(
                SPLITROOM + ["join", url, "--device", dev, "--layers", layers, "--peers", peers] + common, env=env,
                stdout=subprocess.DEVNULL if dev == lose else subprocess.PIPE,
                stderr=subprocess.DEVNULL if dev == lose else subprocess.PIPE, text=True)
        answers = tmp_path / "answers.json"
        host = subprocess.Popen(SPLITROOM + ["join", url, "--device", "h", "--host", "--layers", h_layers, "--peers",
                                             "w1,w2", "--ask", PROMPT, "--max-tokens", str(MAX_NEW),
                                             "--answers-json", str(answers)] + common,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs += [*workers.values(), host]
        read_until(host, "1, 2, 3", 80)  # the answer is streaming: kill a worker now
        os.kill(workers[lose].pid, signal.SIGKILL)
        rest, h_err = host.communicate(timeout=90)
        s_out, s_err = workers[survivor].communicate(timeout=45)  # hang guard under the 60 s host wait
        assert host.returncode == 0, h_err
        assert workers[survivor].returncode == 0, s_err
    got = json.loads(answers.read_text())
    (a,) = got["answers"]
    assert [t for t in a["token_ids"] if t != 2] == want and a["ended"] == "answered"
    assert f"lost {lose}" in h_err
    if lose == "w2":  # the weights came from the host, not from w1's disk
        assert "copying layers 29-30 from h" in s_err and "layers 29-30 copied and verified" in s_err, s_err
        assert "copy from h failed" not in s_err
