"""A random checkpoint a real room can run: scripts/make_gguf.py --tokenizer-from copies another
GGUF's tokenizer (the bundled SmolLM2's), so its prompts encode as SmolLM2's own tokenizer encodes
them; calibration measures such a checkpoint held as stored (weights gguf)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from runtime.calibrate import measure_head, measure_passes, measure_walks  # noqa: E402
from runtime.config import ModelConfig  # noqa: E402
from runtime.tokenizer import ChatTokenizer  # noqa: E402
from runtime.weights import ensure_safetensors, find_gguf, prepare_native  # noqa: E402
from scripts import make_gguf  # noqa: E402

PROMPT = "What is the capital of France? Answer in 3 words, then count 1 2 3."


@pytest.fixture(scope="module")
def tok_file(tmp_path_factory) -> Path:
    """The bundled SmolLM2's tokenizer alone, written by ``make_gguf --tokenizer-only``
    (made once: reading the donor's 49,152 tokens takes about 9 s here)."""
    tok = tmp_path_factory.mktemp("tokonly") / "tok.gguf"
    assert make_gguf.main(["--tokenizer-only", "--tokenizer-from", str(find_gguf()), "--out", str(tok)]) == 0
    return tok


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory, tok_file):
    tmp = tmp_path_factory.mktemp("randtok")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPLITROOM_CACHE", str(tmp / "cache"))
    path = tmp / "tiny.gguf"
    make_gguf.write(path, "tiny", "q8_0", seed=1, tokenizer_from=tok_file)  # through the tokenizer-only file
    yield prepare_native(path, progress=None)
    mp.undo()


def test_random_checkpoint_takes_the_donors_tokenizer(random_dir):
    cfg = ModelConfig.load(random_dir)
    # the bundled SmolLM2: 49,152 tokens, eos <|im_end|> = 2 (its model card)
    assert (cfg.n_layers, cfg.hidden, cfg.vocab, cfg.eos_id) == (3, 256, 49152, 2)
    ref = ChatTokenizer.from_dir(ensure_safetensors(progress=None))
    got = ChatTokenizer.from_dir(random_dir)
    assert got.encode_chat(PROMPT) == ref.encode_chat(PROMPT)
    ids = ref.encode_chat(PROMPT)
    assert got.decode(ids) == ref.decode(ids)


def test_tokenizer_only_file_has_no_tensors(tok_file):
    r = gguf.GGUFReader(str(tok_file))
    assert len(r.tensors) == 0
    assert len(r.fields["tokenizer.ggml.tokens"].data) == 49152
    assert len(r.fields["tokenizer.ggml.merges"].data) == 48900


def test_a_donor_without_tokenizer_is_one_line(tmp_path, capsys):
    bare = tmp_path / "bare.gguf"
    make_gguf.write(bare, "tiny", "q8_0")
    assert make_gguf.main(["--shape", "tiny", "--tokenizer-from", str(bare), "--out", str(tmp_path / "x.gguf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no tokenizer.ggml.tokens" in err[0]


def test_calibration_measures_the_checkpoint_held_as_stored(random_dir):
    curve = measure_passes(str(random_dir), "numpy", tokens=(1, 5), contexts=(16,), reps=1, weights="gguf")
    assert curve.tokens == (1, 5) and curve.contexts == (16,)
    assert all(v >= 0 for row in curve.per_layer_s for v in row)
    head = measure_head(str(random_dir), "numpy", rows=(1, 2), reps=1, weights="gguf")
    assert head.xs == (1.0, 2.0)
    lines = []
    walks = measure_walks(str(random_dir), "numpy", {"chat": (PROMPT,)}, quick=False, log=lines.append,
                          weights="gguf")
    # the drafters that load float32 layers are left out for a checkpoint held as stored, and say so
    assert set(walks["chat"]) == {"ngram"}
    assert any("early_exit, model: not measured" in s for s in lines)
    walked = walks["chat"]["ngram"].accepted
    assert set(walked) == {1, 2, 4, 8}
    assert all(0 <= x <= k for k, xs in walked.items() for x in xs)
    assert np.isfinite([v for xs in walked.values() for v in xs]).all()


def test_a_room_device_holds_the_blocks_as_stored():
    from runtime.control import NodeConfig
    from runtime.precision import Precision

    sched = dict(hidden=256, prefill_chunk=16, eos_token=2, phones=[])
    cfg = NodeConfig(device="a", host="a", stages=[("a", 0, 3)], scheduler=sched, model_dir="/x", weights="gguf")
    assert cfg.precision() == Precision("gguf", "f32", "f32")


def _scenario(tmp_path, gguf_path) -> str:
    text = (Path(__file__).resolve().parents[2] / "scripts" / "gpu_room.py").read_text()
    scn = text.split('SCENARIO = """', 1)[1].split('"""', 1)[0]
    p = tmp_path / "room.yaml"
    p.write_text(scn.replace("MODEL", str(gguf_path)).replace("ANSWER", "8"))
    return str(p)


def test_calibrate_cli_measures_the_scenarios_checkpoint(random_dir, tmp_path):
    from typer.testing import CliRunner

    from runtime.weights import gguf_source
    from splitroom.calibration import load_profile
    from splitroom.cli import app
    prof = tmp_path / "p.yaml"
    src = gguf_source(random_dir)
    r = CliRunner().invoke(app, ["calibrate", _scenario(tmp_path, src), "--out", str(prof), "--quick", "--no-room"])
    assert r.exit_code == 0, r.output
    p = load_profile(prof)
    assert set(p.devices) == {"gpu0", "gpu1", "gpu2"}
    assert p.notes["weights"] == "gguf"
    # a peer's copy is not measured for blocks held as stored (peers serve float32 safetensors)
    assert p.transport is not None and p.transport.weights_Bps is None
    # the frames measured are this model's (hidden 256: 256 * 4 bytes of residual per token)
    from planner.frames import frame_bytes
    assert p.transport.one_way_s.xs[0] == frame_bytes(1, 256)


def test_calibrate_cli_refuses_a_checkpoint_without_tokenizer(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from splitroom.cli import app
    monkeypatch.setenv("SPLITROOM_CACHE", str(tmp_path / "cache"))
    bare = tmp_path / "bare.gguf"
    make_gguf.write(bare, "tiny", "q8_0")
    r = CliRunner().invoke(app, ["calibrate", _scenario(tmp_path, bare), "--out", str(tmp_path / "p.yaml"), "--quick"])
    assert r.exit_code == 2
    # one error line, before any measuring (the only other line: the GGUF's preparation)
    errors = [x for x in r.output.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "has no tokenizer" in errors[0], r.output
    assert "calibrating" not in r.output and "Traceback" not in r.output
