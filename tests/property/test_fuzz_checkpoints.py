"""Fuzzing the model-by-path surfaces (issue 13): a GGUF file's bytes and a config.json's
keys reach ``model: {gguf: PATH}`` / ``{safetensors: DIR}`` through ``splitroom plan`` (the
CLI entry point, in process), and ``--ids`` text reaches its parser. No input may crash (a
traceback, an exit status other than 0 or 2, more than one line of error) or hang.

``SPLITROOM_FUZZ_EXAMPLES=N`` asks for more inputs than the default 30 per surface.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitroom.generate_cmd import parse_ids
from tests.fuzzing import try_cli
from tests.tinymodels import write_random_gguf

FAST = settings(max_examples=int(os.environ.get("SPLITROOM_FUZZ_EXAMPLES", "30")), deadline=None,
                suppress_health_check=list(HealthCheck), database=None)

BASE_CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 16, "num_attention_heads": 2,
               "num_key_value_heads": 1, "intermediate_size": 32, "vocab_size": 64, "rms_norm_eps": 1e-5,
               "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64},
               "tie_word_embeddings": True, "eos_token_id": [2, 3], "head_dim": 8}
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=8)


def check(o):
    assert o.kind in ("ok", "refused"), f"{o.kind}: {o.detail}"


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory):
    p = tmp_path_factory.mktemp("g") / "t.gguf"
    write_random_gguf(p, layers=2, hidden=16, heads=2, kv_heads=1, ffn=32)
    return p.read_bytes()


@st.composite
def mutated(draw, base: bytes) -> bytes:
    how = draw(st.sampled_from(["flip", "cut", "random"]))
    if how == "cut":
        return base[:draw(st.integers(0, len(base)))]
    if how == "random":
        return b"GGUF" + draw(st.binary(max_size=600))
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 8))):  # the header and metadata live in the first bytes
        i = draw(st.integers(4, min(len(data), 2048) - 1))
        data[i] = draw(st.integers(0, 255))
    return bytes(data)


def test_gguf_files_never_crash(tmp_path_factory, gguf_bytes):
    @FAST
    @given(data=mutated(gguf_bytes))
    def run(data):
        d = tmp_path_factory.mktemp("fz")
        (d / "m.gguf").write_bytes(data)
        (d / "room.yaml").write_text("model: {gguf: m.gguf}\ncontext: 64\ndevices:\n  - {id: a, lends: 1 GB}\n")
        check(try_cli(d / "room.yaml", []))
    run()


@FAST
@given(changes=st.dictionaries(st.sampled_from(sorted(BASE_CONFIG) + ["rope_scaling", "sliding_window",
                                                                       "attention_bias", "hidden_act"]),
                               JSON, min_size=1, max_size=3) | JSON)
def test_config_json_never_crashes(tmp_path_factory, changes):
    d = tmp_path_factory.mktemp("fz")
    (d / "m").mkdir()
    cfg = dict(BASE_CONFIG, **changes) if isinstance(changes, dict) else changes
    (d / "m" / "config.json").write_text(json.dumps(cfg))
    (d / "room.yaml").write_text("model: {safetensors: m}\ncontext: 64\ndevices:\n  - {id: a, lends: 1 GB}\n")
    check(try_cli(d / "room.yaml", []))


@FAST
@given(text=st.text(max_size=40) | st.lists(st.integers(-5, 70), max_size=6).map(lambda x: ",".join(map(str, x))))
def test_ids_text_is_parsed_or_refused(text):
    try:
        ids = parse_ids(text, 64)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    assert ids and all(0 <= i < 64 for i in ids)
