"""The planner counts the KV cache the runtime allocates: device processes size their cache
from the scenario's ``context`` (not a fixed 2,048 positions) at the scenario's ``kv_cache``
storage, and the deal counts the same bytes. Expected bytes worked out by hand for a tiny
Llama GGUF (6 layers, 2 KV heads of 16)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.deal import deal
from runtime.node import load_device
from runtime.weights import ensure_safetensors
from splitroom.real_configs import node_configs, real_model_dir
from splitroom.scenario import load
from tests.tinymodels import small_vocab, write_random_gguf

CONTEXT = 300


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv")
    d = ensure_safetensors()
    template = json.loads((d / "tokenizer_config.json").read_text())["chat_template"]
    p = root / "tiny.gguf"
    write_random_gguf(p, tokenizer=(small_vocab(d / "tokenizer.json", 1000), "smollm", template))
    return p


@pytest.mark.parametrize("kv,bytes_per_value", [("f16", 2), ("f32", 4)])
def test_device_kv_cache_is_what_the_deal_counts(gguf_path, tmp_path, monkeypatch, kv, bytes_per_value):
    monkeypatch.setenv("SPLITROOM_CACHE", str(tmp_path / "cache"))
    y = tmp_path / "room.yaml"
    y.write_text(f"""model: {{gguf: {gguf_path}}}
context: {CONTEXT}
kv_cache: {kv}
devices:
  - {{id: a, lends: 50 MB}}
  - {{id: b, lends: 50 MB}}
stages:
  - {{device: a, layers: 1-2}}
  - {{device: b, layers: 3-6}}
""")
    scn = load(y)
    d = deal(scn.devices, scn.model, scn.options)
    # by hand: K and V, 2 KV heads of 16 values, at CONTEXT positions, per layer
    per_layer = 2 * 2 * 16 * CONTEXT * bytes_per_value
    assert scn.model.kv_bytes(CONTEXT, kv) == per_layer
    cfgs = node_configs(scn, d, str(real_model_dir(scn)), tmp_path, "numpy")
    held = {}
    for c in cfgs:
        stage, _, _ = load_device(c)
        assert stage.max_ctx == CONTEXT
        stage.embed_forward([1], 0) if stage.is_host else stage.forward(np.zeros((1, 64), np.float32), 0)
        for L in stage.layers:  # grow every layer's cache to the whole context, as a full room does
            stage._ensure_cache(L, CONTEXT)
        held[c.device] = sum(L.k.nbytes + L.v.nbytes for L in stage.layers)
    assert held == {"a": 2 * per_layer, "b": 4 * per_layer}
    for s in d.stages:
        assert held[s.device] == (s.end - s.start) * scn.model.kv_bytes(CONTEXT, scn.options.kv_cache)
