"""splitroom/host_queue.py: the host's questions on disk, read back after a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitroom.host_queue import HostQueue, QueueError


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_questions_taken_and_not_ended_are_pending_in_order(tmp_path):
    f = tmp_path / "q.jsonl"
    q = HostQueue.open(f)  # no file yet: empty
    assert q.pending() == []
    assert [q.take(p) for p in ("a", "b", "c")] == [0, 1, 2]
    q.end(1, "answered")
    again = HostQueue.open(f)  # what a host started again reads
    assert again.pending() == [0, 2] and again.prompts == ["a", "b", "c"] and again.ended == {1: "answered"}
    assert lines(f) == [{"asked": 0, "prompt": "a"}, {"asked": 1, "prompt": "b"}, {"asked": 2, "prompt": "c"},
                        {"ended": 1, "how": "answered"}]
    with pytest.raises(KeyError):
        again.end(1, "answered")  # ended already


def test_a_last_line_cut_short_by_the_crash_is_dropped_before_the_next_write(tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text('{"asked": 0, "prompt": "a"}\n{"ended": 0, "ho')
    q = HostQueue.open(f)
    assert q.pending() == [0]
    q.take("b")
    assert lines(f) == [{"asked": 0, "prompt": "a"}, {"asked": 1, "prompt": "b"}]


@pytest.mark.parametrize("text, words", [
    ('{"asked": 1, "prompt": "a"}\n', "q.jsonl:1: asked must be the next question number (0)"),
    ('{"asked": 0, "prompt": 5}\n', "q.jsonl:1: prompt must be Unicode text"),
    ('{"asked": 0, "prompt": "\\ud800 hi"}\n', "q.jsonl:1: prompt must be Unicode text"),  # a lone surrogate
    ('{"ended": 0, "how": "answered"}\n', "q.jsonl:1: ended must name a question taken"),
    ('{"asked": 0, "prompt": "a"}\n{"ended": 0, "how": "x"}\n{"ended": 0, "how": "x"}\n', "q.jsonl:3: ended"),
    ('{"asked": true, "prompt": "a"}\n', "q.jsonl:1: asked must be"),
    ('[1, 2]\n', "q.jsonl:1: expected"),
    ('\xff\n', "q.jsonl:1: not a JSON line"),
])
def test_a_malformed_queue_names_the_line(tmp_path, text, words):
    f = tmp_path / "q.jsonl"
    f.write_bytes(text.encode("latin-1"))
    with pytest.raises(QueueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        HostQueue.open(f)


def test_join_refuses_a_malformed_queue_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from splitroom.cli import app
    f = tmp_path / "q.jsonl"
    f.write_text("not json\n")
    r = CliRunner().invoke(app, ["join", "ws://127.0.0.1:9/room/r", "--device", "h", "--host", "--peers", "w",
                                 "--queue", str(f)])
    assert r.exit_code == 2 and "q.jsonl:1: not a JSON line" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["join", "ws://127.0.0.1:9/room/r", "--device", "w", "--peers", "h", "--queue", str(f)])
    assert r.exit_code == 2 and "--queue keeps the questions of a host" in r.output
    # a question that is not Unicode (a lone surrogate, as undecodable argv bytes arrive)
    r = CliRunner().invoke(app, ["join", "ws://127.0.0.1:9/room/r", "--device", "h", "--host", "--peers", "w",
                                 "--ask", "bad \udced bytes"])
    assert r.exit_code == 2 and "--ask number 1 is not valid Unicode text" in r.output


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_open_as_a_queue_or_one_error(tmp_path_factory, data):
    f = tmp_path_factory.mktemp("q") / "q.jsonl"
    f.write_bytes(data)
    try:
        q = HostQueue.open(f)
    except QueueError as e:
        assert "\n" not in str(e)
        return
    assert all(n < len(q.prompts) for n in q.pending())


def test_a_queue_that_is_not_a_regular_file_or_has_no_name_is_refused(tmp_path):
    import os
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would block the host for ever
    with pytest.raises(QueueError, match="must be a regular file"):
        HostQueue.open(fifo)
    with pytest.raises(QueueError, match="must be a regular file"):
        HostQueue.open(tmp_path)
    with pytest.raises(QueueError, match="give a file name"):
        HostQueue.open("")
