"""``splitroom join`` on 127.0.0.1: a relay subprocess and two device processes (the host
with layers 1-15, a worker with 16-30) answer one question, and the answer is token for
token the single-process greedy answer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from runtime.backends import StageSpec, make_stage
from runtime.generate import generate_greedy
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors
from splitroom.join_cmd import JoinError, parse_layers, parse_room_url, plan_room
from tests.joinroom import SPLITROOM, relay_room
from tests.sampled import sampled_reference

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
MAX_NEW = 10


def test_people_write_layers_1_based_inclusive():
    assert parse_layers("1-15", 30) == (0, 15) and parse_layers("16-30", 30) == (15, 30)
    assert parse_layers("auto", 30) is None
    for bad in ("0-15", "16-31", "15-3", "x"):
        with pytest.raises(JoinError):
            parse_layers(bad, 30)
    assert parse_room_url("ws://10.0.0.2:8765/room/home") == ("ws://10.0.0.2:8765", "home")
    with pytest.raises(JoinError):
        parse_room_url("http://10.0.0.2:8765/home")
    ok = {"a": {"layers": [0, 15]}, "b": {"layers": [15, 30]}}
    assert plan_room(ok, "a", 30) == [["a", 0, 15], ["b", 15, 30]]
    with pytest.raises(JoinError, match="must hold the first layers"):
        plan_room(ok, "b", 30)
    with pytest.raises(JoinError, match="gap"):
        plan_room({"a": {"layers": [0, 10]}, "b": {"layers": [15, 30]}}, "a", 30)
    with pytest.raises(JoinError, match="auto"):
        plan_room({"a": {"layers": None}, "b": {"layers": [15, 30]}}, "a", 30)
    dealt = plan_room({"a": {"layers": None, "lends": 1 << 30}, "b": {"layers": None, "lends": 1 << 30}}, "a", 30)
    assert dealt[0][:2] == ["a", 0] and dealt[-1][2] == 30


def two_devices(room: str, answers: Path, *host_args: str, key: str | None = None) -> tuple[str, str, str]:
    """Host h (layers 1-15, asks PROMPT, ``host_args`` added) and worker w (16-30) join
    ``room`` through a relay (with the room key ``key`` in the URL when given: every
    device then proves it over its DTLS certificate); returns the host's stdout and
    stderr and the worker's stderr once both exited 0 (bounded: 100 s, room for a
    machine shared by other work)."""
    with relay_room(room) as (url, env, procs):
        if key is not None:
            url += f"?key={key}"
        common = ["--address", "127.0.0.1", "--timeout", "100"]
        worker = subprocess.Popen(SPLITROOM + ["join", url, "--device", "w", "--layers", "16-30", "--peers", "h"]
                                  + common, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(worker)
        host = subprocess.Popen(SPLITROOM + ["join", url, "--device", "h", "--host", "--layers", "1-15", "--peers",
                                             "w", "--ask", PROMPT, "--max-tokens", str(MAX_NEW),
                                             "--answers-json", str(answers), *host_args] + common,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(host)
        h_out, h_err = host.communicate(timeout=105)
        # the host's bye ends the worker. 45 s is a hang guard, not a bound: a worker that
        # missed the bye waits --host-wait (60 s) for the host to come back and exits non-zero,
        # so a lost bye still fails here, while a slow exit on a loaded machine does not (10 s
        # did not hold beside other work: a fresh clone on 2026-12-03 at load 4-5).
        w_out, w_err = worker.communicate(timeout=45)
        assert host.returncode == 0, h_err
        assert worker.returncode == 0, w_err
    return h_out, h_err, w_err


def test_two_joined_devices_answer_like_one_process(tmp_path: Path):
    model_dir = ensure_safetensors()
    tok = ChatTokenizer.from_dir(model_dir)
    whole = make_stage("numpy", model_dir, StageSpec(0, 30, host=True))
    want = [t for t in generate_greedy([whole], tok.encode_chat(PROMPT), MAX_NEW).ids if t != 2]

    answers = tmp_path / "answers.json"
    h_out, h_err, w_err = two_devices("jointest", answers, key="test-room-key-0123456789")
    got = json.loads(answers.read_text())
    assert got["stages"] == [["h", 0, 15], ["w", 15, 30]]
    (a,) = got["answers"]
    assert [t for t in a["token_ids"] if t != 2] == want and a["ended"] == "answered"
    text = tok.decode(want)
    assert text in h_out and "tokens/s" in h_out
    assert "plan: h layers 1-15 (host), w layers 16-30" in w_err


def test_joined_room_speculates_and_samples_with_the_hosts_seed(tmp_path: Path):
    """The host's --draft-tokens and --temperature/--seed: the answer is the one the seed
    stands for (computed without the scheduler), speculation or not."""
    want = sampled_reference(PROMPT, 0.9, 21, MAX_NEW)
    answers = tmp_path / "answers.json"
    h_out, h_err, w_err = two_devices("jointest2", answers, "--draft-tokens", "3", "--temperature", "0.9",
                                      "--seed", "21")
    assert "sampling: temperature 0.9, top_p 1, top_k 0, seed 21; speculation: 3 tokens drafted by ngram" in h_err
    (a,) = json.loads(answers.read_text())["answers"]
    assert [t for t in a["token_ids"] if t != 2] == want and a["ended"] == "answered"


def test_only_the_host_decides_how_the_room_decodes(tmp_path: Path):
    from splitroom.join_cmd import JoinOptions, room_decoding
    scn = tmp_path / "room.yaml"
    scn.write_text(Path("scenarios/home.yaml").read_text().replace("speculative: null", "speculative: {drafter: "
                   "ngram, draft_tokens: 5}\n  sampling: {temperature: 0.5, top_k: 7}"))
    dec, seed = room_decoding(JoinOptions("ws://x:1/room/r", "h", host=True, scenario=str(scn)))
    assert (dec.speculative.draft_tokens, dec.speculative.drafter) == (5, "ngram")
    assert (dec.sampling.temperature, dec.sampling.top_k, dec.sampling.seed) == (0.5, 7, seed)  # the scenario's seed
    dec, _ = room_decoding(JoinOptions("ws://x:1/room/r", "h", host=True, scenario=str(scn), draft_tokens=0,
                                       temperature=0.0))
    assert dec.speculative is None and dec.sampling.greedy
    with pytest.raises(JoinError, match="--top-p"):
        room_decoding(JoinOptions("ws://x:1/room/r", "h", host=True, top_p=1.5))
    with pytest.raises(JoinError, match="not available in real rooms"):
        room_decoding(JoinOptions("ws://x:1/room/r", "h", host=True, draft_tokens=2, drafter="draft_layer"))
    r = subprocess.run(SPLITROOM + ["join", "ws://127.0.0.1:1/room/r", "--device", "w", "--peers", "h",
                                    "--temperature", "0.7"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "only the host" in r.stderr and "--temperature" in r.stderr
