"""`splitroom join`: a host whose question is refused (a prompt longer than the room's
context, refused at once with its lengths) exits non-zero (6) naming the reason; the
next question is still answered, and the worker ends normally on the host's bye."""

from __future__ import annotations

import subprocess

import pytest

from tests.joinroom import SPLITROOM, relay_room

pytestmark = pytest.mark.slow


def test_a_refused_question_makes_the_host_exit_6_with_the_reason():
    long_prompt = "word " * 2100  # over the 2,048-position context
    with relay_room("refusal") as (url, env, procs):
        common = ["--address", "127.0.0.1", "--timeout", "100"]
        worker = subprocess.Popen(SPLITROOM + ["join", url, "--device", "w", "--layers", "16-30", "--peers", "h"]
                                  + common, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        host = subprocess.Popen(SPLITROOM + ["join", url, "--device", "h", "--host", "--layers", "1-15", "--peers", "w",
                                             "--ask", long_prompt, "--ask", "Hi", "--max-tokens", "4"] + common,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs += [worker, host]
        out, err = host.communicate(timeout=105)
        _, w_err = worker.communicate(timeout=45)  # hang guard under the 60 s host wait
    assert host.returncode == 6, err
    assert "not every question was answered: question 1: refused" in err and "2048" in err.replace(",", "")
    assert out.count("-- ") == 2 and "(answered)" in out  # both questions reported, the second answered
    assert worker.returncode == 0, w_err
