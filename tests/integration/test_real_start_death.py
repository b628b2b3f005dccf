"""`splitroom run --real` with a worker whose process dies while it loads its layers
(its model directory does not exist here, so it ends before it joins the room): the
room starts again without it when the devices left can hold the model, and answers with
the single-process greedy tokens; otherwise the run ends at once with one line naming
the device, not after the host's open timeout.

The deals are the planner's rules worked by hand on scenarios/home.yaml (SmolLM2: 30
layers of about 14 MB with their KV cache): pinned desktop 1-20, laptop 21-26, phone
27-30 without the phone merges 27-30 into the laptop (10 layers, within its 200 MB); the
default deal (laptop 1-4, desktop 5-23, phone 24-30) cannot do without the phone (see
tests/unit/test_serve_start_death.py)."""

from __future__ import annotations

import pytest

import splitroom.real as real
from planner.deal import deal
from runtime.backends import StageSpec, make_stage
from runtime.generate import generate_greedy
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors
from splitroom.real import run_real
from splitroom.real_errors import RealRunError
from splitroom.scenario import load

pytestmark = pytest.mark.slow

PROMPT = "What is the capital of France?"
WORKLOAD = ["workload.questions=1", "workload.answer_tokens=8", f"workload.prompts=['{PROMPT}']"]


@pytest.fixture
def phone_cannot_load(monkeypatch):
    """The phone's process is told to read its layers from a folder that does not exist."""
    made = real.node_configs

    def broken(scn, d, model_dir, workdir, backend):
        return [c.model_copy(update={"model_dir": "/nonexistent/splitroom-no-model"}) if c.device == "phone" else c
                for c in made(scn, d, model_dir, workdir, backend)]
    monkeypatch.setattr(real, "node_configs", broken)


def test_a_worker_that_dies_while_loading_is_dealt_out_and_the_room_answers(phone_cannot_load):
    md = ensure_safetensors()
    ids = ChatTokenizer.from_dir(md).encode_chat(PROMPT)
    want = [t for t in generate_greedy([make_stage("numpy", md, StageSpec(0, 30, True))], ids, 8).ids if t != 2]
    scn = load("scenarios/home.yaml", WORKLOAD + [
        "devices[0].lends=1 GB",
        "stages=[{device: desktop, layers: '1-20'}, {device: laptop, layers: '21-26'}, {device: phone, layers: '27-30'}]"])
    said = []
    res = run_real(scn, deal(scn.devices, scn.model, scn.options), netns=False, timeout_s=120, log=said.append)
    assert "phone died while loading: re-dealt without it: desktop 1-20, laptop 21-30" in said, said
    assert res.answers[0]["token_ids"] == want and res.answers[0]["ended"] == "answered"


def test_a_worker_the_room_cannot_do_without_is_named_in_one_line(phone_cannot_load):
    scn = load("scenarios/home.yaml", WORKLOAD)
    # the host's open timeout is this run's timeout: the error must come from the death, not from it
    with pytest.raises(RealRunError) as e:
        run_real(scn, deal(scn.devices, scn.model, scn.options), netns=False, timeout_s=120, log=lambda s: None)
    msg = str(e.value)
    assert msg.startswith("cannot start: phone died while loading (status ") and "\n" not in msg, msg
    assert "cannot hold the model" in msg, msg
