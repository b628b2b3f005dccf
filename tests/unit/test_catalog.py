"""The model catalog against the architecture facts of issue 2 and hand-computed sizes."""

from __future__ import annotations

import pytest

from planner.model import catalog, lookup


@pytest.mark.parametrize("model_id, layers, hidden", [
    ("smollm2-135m", 30, 576),
    ("qwen3.8-27b", 64, 5120),
    ("qwen3.6-35b-a3b", 40, 2048),
    ("qwen2.5-7b", 28, 3584),
    ("mistral-7b", 32, 4096),
    ("glm-5.2-744b", 78, None),
])
def test_layers_and_hidden(model_id, layers, hidden):
    m = lookup(model_id)
    assert m.layers == layers
    if hidden is not None:
        assert m.hidden == hidden


def test_residual_bytes_per_token():
    # Issue 2: about 10 KB per token for the 27B (5120 x 2 B), about 4 KB for the MoE.
    assert lookup("qwen3.8-27b").residual_bytes_per_token == 10240
    assert lookup("qwen3.6-35b-a3b").residual_bytes_per_token == 4096


def test_smollm2_sizes_by_hand():
    # Per layer: q 576x576 + k 576x192 + v 576x192 + o 576x576 = 884,736;
    # MLP 3 x 576 x 1536 = 2,654,208; two RMSNorm vectors 1,152 -> 3,540,096 parameters.
    # float32: 4 bytes each. Embedding 49152 x 576 = 28,311,552, tied (no separate head).
    m = lookup("smollm2-135m")
    assert m.layer_bytes == 3_540_096 * 4
    assert m.embedding_bytes == 49152 * 576 * 4
    assert m.head_bytes == 0
    # K and V: 3 KV heads x 64 x 2 bytes each -> 768 B per token per layer.
    assert m.kv_bytes_per_token == 768
    # The whole model: about 135M parameters, about 540 MB at float32.
    params = (30 * m.layer_bytes + m.embedding_bytes) // 4
    assert params == 30 * 3_540_096 + 28_311_552 == 134_514_432
    assert 530e6 < 30 * m.layer_bytes + m.embedding_bytes < 545e6


def test_qwen25_7b_sizes_by_hand():
    # Per layer: q 3584x3584 + k 3584x512 + v 3584x512 + o 3584x3584 = 29,360,128;
    # MLP 3 x 3584 x 18944 = 203,685,888; norms 7,168 -> 233,053,184 (biases left out).
    # Embedding 152064 x 3584 = 544,997,376 and an untied head of the same size.
    # 28 x 233,053,184 + 2 x 544,997,376 = 7,615,483,904: "7.6B" as published (7.61B).
    m = lookup("qwen2.5-7b")
    assert m.layer_bytes == 233_053_184 * 2  # bf16
    assert m.embedding_bytes == m.head_bytes == 544_997_376 * 2
    params = (28 * m.layer_bytes + m.embedding_bytes + m.head_bytes) // 2
    assert params == 7_615_483_904
    # 4 KV heads x 128 x 2 (K, V) x 2 bytes
    assert m.kv_bytes_per_token == 2048


@pytest.mark.parametrize("model_id, bits, total_b, active_b, tol", [
    ("mistral-7b", 16, 7.25, 7.25, 0.02),        # published 7.25B
    ("qwen3.8-27b", 4.5, 27.0, 27.0, 0.05),      # "27B"
    ("qwen3.6-35b-a3b", 4.5, 35.0, 3.0, 0.05),   # "35B", "A3B"
    ("glm-5.2-744b", 4.5, 744.0, 40.0, 0.10),    # 744B total, about 40B active
])
def test_parameter_counts_near_published(model_id, bits, total_b, active_b, tol):
    m = lookup(model_id)
    bpw = bits / 8
    total = (m.layers * m.layer_bytes + m.embedding_bytes + m.head_bytes) / bpw
    active = (m.layers * m.layer_active_bytes + m.embedding_bytes + m.head_bytes) / bpw
    assert total == pytest.approx(total_b * 1e9, rel=tol)
    assert active == pytest.approx(active_b * 1e9, rel=tol)


def test_moe_reads_fewer_bytes_than_it_stores():
    m = lookup("qwen3.6-35b-a3b")
    assert m.layer_active_bytes < m.layer_bytes / 5
    d = lookup("qwen2.5-7b")
    assert d.layer_active_bytes == d.layer_bytes


def test_catalog_and_unknown_id():
    ids = set(catalog())
    assert {"smollm2-135m", "qwen3.8-27b", "qwen3.6-35b-a3b", "qwen2.5-7b", "mistral-7b",
            "glm-5.2-744b"} <= ids
    with pytest.raises(KeyError, match="smollm2-135m"):  # names the known ids
        lookup("nope")
