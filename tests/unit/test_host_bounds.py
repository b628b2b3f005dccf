"""What a long-lived model host keeps is bounded: the trace by bytes as well as records,
the room page's API clients by count and age (and a snapshot does not sort them all),
and the log of bad requests by lines a second, each one line without exception text."""

from __future__ import annotations

import gc
import logging
import tracemalloc

import pytest

from planner.protocol import EmitToken, QuestionAsked
from planner.sampling import MIN_TEMPERATURE, Sampling
from runtime.logs import OneLine
from runtime.room import RECORD_BYTES, BoundedTrace, record_bytes
from runtime.serve import page as page_mod
from runtime.serve.page import RoomPage


def test_the_trace_is_bounded_by_bytes_not_only_records():
    t = BoundedTrace(max_records=1000, max_bytes=1_000_000)
    for i in range(20):  # 20 questions of 10,000 tokens: 400,400 bytes each by the estimate
        t.append((float(i), QuestionAsked(i, "api:x", tuple(range(10_000)), 4)))
    assert len(t) == 2  # floor(1,000,000 / (400 + 40 * 10,000)) = 2, the latest ones
    assert [o.question_id for _, o in t] == [18, 19] and t.dropped == 18
    assert t.bytes == 2 * (400 + 40 * 10_000)
    for i in range(1500):  # small records: the record count bounds it
        t.append((float(i), EmitToken(0, "api:x", i, 5)))
    assert len(t) == 1000 and t.bytes == 1000 * RECORD_BYTES


def test_the_byte_estimate_is_not_below_what_a_prompt_really_holds():
    """The estimate is within 5% of what Python allocates for a question of 20,000 ids
    (tracemalloc: the event, its tuple and the int objects, ids above 256 as a real
    vocabulary has)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    q = QuestionAsked(1, "api:x", tuple(int(i) for i in range(1000, 21_000)), 4)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert abs(record_bytes(q) - used) <= 0.05 * used, (used, record_bytes(q))


def test_the_page_forgets_old_and_surplus_clients_and_shows_the_latest(monkeypatch):
    now = [0.0]

    class Srv:  # what the snapshot reads of a server with no node
        room_info, node, lost, phase, model_id, guest_info, last_tokens_per_s = {}, None, [], "starting", "m", None, None

        def readiness(self):
            return False, "starting", 5

        def _host(self):
            return None

        def lap_mean_s(self):
            return None

        def in_flight_limit(self):
            return 1
    pg = RoomPage(Srv(), clock=lambda: now[0])
    for i in range(5000):
        now[0] = i * 0.001
        pg.client_seen(f"api:key-{i:05d}")
    assert len(pg.clients) == page_mod.MAX_CLIENTS_KEPT
    assert next(iter(pg.clients)) == "api:key-04000"  # the 1,000 most recent are kept
    shown = pg.snapshot()["clients"]
    assert [c["ids"] for c in shown] == [[f"api:key-{i:05d}" for i in range(4950, 5000)]]  # one chip of 50
    pg.client_seen("api:key-04000")  # asked again: it becomes the latest
    assert list(pg.clients)[-1] == "api:key-04000" and pg.clients["api:key-04000"]["questions"] == 2
    now[0] = 5.0 + page_mod.CLIENT_SHOWN_S + 1  # everyone's last question is past the window
    pg.client_seen("api:new")
    assert list(pg.clients) == ["api:new"]
    assert [c["ids"] for c in pg.snapshot()["clients"]] == [["api:new"]]


def _record(msg="Error handling request from %s", args=("127.0.0.1",), exc=None):
    return logging.LogRecord("x", logging.ERROR, __file__, 1, msg, args,
                             (type(exc), exc, None) if exc is not None else None)


def test_a_bad_request_logs_one_line_without_its_text_and_the_lines_are_rate_limited():
    now = [100.0]
    f = OneLine(per_s=10, clock=lambda: now[0])
    secret = "4f1c" * 16
    r = _record(exc=ValueError(f"raw request:\n  {secret}"))
    assert f.filter(r)
    assert r.getMessage() == "Error handling request from 127.0.0.1: ValueError"
    assert r.exc_info is None and r.exc_text is None
    assert sum(f.filter(_record()) for _ in range(49)) == 9  # 10 a second
    now[0] = 101.2
    r = _record()
    assert f.filter(r)
    assert r.getMessage().startswith("(40 similar lines in the last second not logged) ")
    r = _record("two\nlines %s", ("x",))
    assert f.filter(r) and r.getMessage() == "two lines x"


def test_a_temperature_too_small_to_divide_by_is_refused():
    assert Sampling(MIN_TEMPERATURE).temperature == 1e-5
    for t in (5e-324, 1e-300, 9.99e-6):
        with pytest.raises(ValueError, match="temperature"):
            Sampling(t)


def test_a_childs_log_is_rotated_and_bounded(tmp_path):
    import subprocess
    import sys

    from runtime.logs import rotate_into
    child = subprocess.Popen([sys.executable, "-c", "for i in range(30000): print(f'line {i:06d} ' + 'x' * 88)"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    path = tmp_path / "dev.log"
    rotate_into(child.stdout, str(path), max_bytes=1_000_000, backups=2).join(timeout=60)
    assert child.wait(timeout=30) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["dev.log", "dev.log.1", "dev.log.2"]  # 3,000,000 bytes written, 3 files kept
    assert all((tmp_path / f).stat().st_size <= 1_000_000 for f in files)
    assert path.read_text().splitlines()[-1].startswith("line 029999 ")
    assert (tmp_path / "dev.log.2").read_text().splitlines()[0] > "line 000000"  # the oldest were let go


def test_room_processes_write_their_output_through_the_rotated_log(tmp_path, monkeypatch):
    import os
    import sys

    from runtime import logs
    from splitroom.real_procs import _last_log_line, start_process
    monkeypatch.setattr(logs, "LOG_FILE_BYTES", 1000)
    p = start_process(None, "dev", [sys.executable, "-c", "import sys\nfor i in range(300): print(f'line {i:03d}')\n"
                                    "print('the last', file=sys.stderr)"], tmp_path, dict(os.environ))
    assert p.wait(timeout=30) == 0
    assert _last_log_line(tmp_path, "dev") == "the last"  # stdout and stderr both kept
    assert sorted(x.name for x in tmp_path.iterdir()) == ["dev.log", "dev.log.1", "dev.log.2"]
    assert (tmp_path / "dev.log.2").read_text().startswith("line 0")  # 9 bytes a line, 1,000 a file


def test_a_frame_no_command_takes_up_is_not_kept():
    """A worker node keeps the residual of a frame only while a command will use it: a
    frame of a kind a worker does not handle, and a stale one, leave nothing behind."""
    import numpy as np

    from planner.frames import FrameHeader, FrameKind
    from runtime.codec import encode_frame
    from tests.fuzzing import worker_node
    node = worker_node()

    def feed(h):
        async def go():
            node._on_message("host", "residual", encode_frame(h, np.ones((h.tokens, 576), np.float32)))
        node.fuzz_loop.run_until_complete(go())
    feed(FrameHeader(FrameKind.RESULT, 1, 7, 0, 4, 576))  # not a worker's kind: ignored
    assert node.residual == {}
    feed(FrameHeader(FrameKind.PREFILL, 2, 8, 0, 4, 576))  # run here: kept for its RunStage
    assert list(node.residual) == [8]
    feed(FrameHeader(FrameKind.DECODE, 2, 9, 40, 1, 576))  # past the cache: dropped as stale
    assert list(node.residual) == [8]
    node.fuzz_loop.close()
