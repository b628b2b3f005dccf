"""`splitroom run --real` reports every question it did not answer (issue 11): a
question longer than the room's context is refused with its lengths, the next is
answered, the command prints one line per unanswered question and exits with status 1,
and its temporary work folder is gone afterwards."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from typer.testing import CliRunner

from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors
from splitroom.cli import app

pytestmark = pytest.mark.slow

LONG = "Tell me everything about " + "the history of every city in Europe, " * 12
SHORT = "What is the capital of France?"
ANSWER = 8


def test_a_question_the_room_cannot_hold_is_refused_before_the_room_starts(monkeypatch):
    tok = ChatTokenizer.from_dir(ensure_safetensors())
    long_len, short_len = len(tok.encode_chat(LONG)), len(tok.encode_chat(SHORT))
    context = short_len + ANSWER  # the short question fits exactly, the long one does not
    made = []
    real_mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*a, **kw):
        made.append(real_mkdtemp(*a, **kw))
        return made[-1]
    monkeypatch.setattr("splitroom.real.tempfile.mkdtemp", recording_mkdtemp)
    sets = ["workload.questions=2", f"workload.answer_tokens={ANSWER}", f"context={context}",
            f"workload.prompts={json.dumps([LONG, SHORT])}", "devices[1].lends=400 MB", "devices[2].lends=0 B"]
    args = ["run", "scenarios/home.yaml", "--real", "--loopback", "--json", "--timeout", "120"]
    r = CliRunner().invoke(app, args + [a for s in sets for a in ("--set", s)])
    # a workload question the room cannot hold is refused before any process starts: one
    # line with the lengths, exit 2, nothing left behind (the room would refuse it anyway)
    assert r.exit_code == 2, (r.exit_code, r.stderr[-2000:], r.exception)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and (f"question 1 does not fit: a prompt of {long_len} tokens + {ANSWER} answer tokens "
                              f"> {context} positions") in err[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert all(not os.path.exists(d) for d in made)  # the work folder, if made, is gone
