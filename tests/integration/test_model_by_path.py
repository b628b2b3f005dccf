"""Models given by path: ``--model PATH`` on ``generate`` and ``run --real``, ``model: {gguf: PATH}``
/ ``{safetensors: DIR}`` in scenarios, the GGUF cache keyed by the file, and one-line errors
(exit 2) for bad paths and architectures the runtime does not compute.

The checkpoints are tiny random-weight Llama models made here with ``transformers``
(tests/tinymodels.py) with a 3,000-token cut of SmolLM2's tokenizer and chat template; every
answer is compared with ``transformers``' own greedy continuation.
"""

from __future__ import annotations

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from typer.testing import CliRunner  # noqa: E402

from runtime.tokenizer import ChatTokenizer  # noqa: E402
from runtime.weights import ensure_safetensors  # noqa: E402
from splitroom.cli import app  # noqa: E402
from tests.tinymodels import greedy_reference, make_model, small_vocab, write_gguf  # noqa: E402

VOCAB = 3000
PROMPT_IDS = [1, 493, 198, 604, 2, 33, 34, 216]
STEPS = 8
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=512,
             bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """``{"root", "gguf": path, "dir": safetensors dir, "model": llama, "qwen": qwen2 model}``."""
    root = tmp_path_factory.mktemp("bypath")
    d = ensure_safetensors()
    template = json.loads((d / "tokenizer_config.json").read_text())["chat_template"]
    vocab = small_vocab(d / "tokenizer.json", VOCAB)
    llama = make_model(transformers.LlamaConfig(**SHAPE, tie_word_embeddings=True), 1)
    write_gguf(llama, root / "tiny-llama.gguf", tokenizer=(vocab, "smollm", template))
    qwen = make_model(transformers.Qwen2Config(**SHAPE, tie_word_embeddings=False), 2)
    qwen.save_pretrained(root / "tiny-qwen2")
    # the tokenizer as transformers builds it from the GGUF, saved beside the Qwen2 weights
    tok = transformers.AutoTokenizer.from_pretrained(str(root), gguf_file="tiny-llama.gguf")
    tok.save_pretrained(root / "tiny-qwen2")
    return {"root": root, "gguf": root / "tiny-llama.gguf", "dir": root / "tiny-qwen2", "model": llama, "qwen": qwen,
            "tok": tok}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITROOM_CACHE", str(tmp_path / "cache"))


def _until_stop(ids, stops=(2,)):
    out = []
    for t in ids:
        out.append(t)
        if t in stops:
            break
    return out


def _cli(*args):
    return CliRunner().invoke(app, list(args))


def test_generate_ids_json_equals_transformers(tiny):
    r = _cli("generate", "--model", str(tiny["gguf"]), "--ids", ",".join(map(str, PROMPT_IDS)), "--json",
             "--max-tokens", str(STEPS))
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.strip().splitlines()[-1])
    _, ref = greedy_reference(tiny["model"], PROMPT_IDS, STEPS)
    assert got["prompt_ids"] == PROMPT_IDS
    assert got["token_ids"] == _until_stop(ref)
    assert got["model"] == "tiny-llama"


def test_generate_text_from_safetensors_dir_equals_transformers(tiny):
    """An untied Qwen2 directory with transformers' tokenizer files: the chat prompt's ids are
    apply_chat_template's, the answer transformers' greedy one."""
    r = _cli("generate", "--model", str(tiny["dir"]), "What is 12 + 345?", "--json", "--max-tokens", str(STEPS))
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.strip().splitlines()[-1])
    want_prompt = tiny["tok"].apply_chat_template([{"role": "user", "content": "What is 12 + 345?"}],
                                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    assert got["prompt_ids"] == list(want_prompt)
    _, ref = greedy_reference(tiny["qwen"], got["prompt_ids"], STEPS)
    assert got["token_ids"] == _until_stop(ref)
    assert got["text"] == tiny["tok"].decode([t for t in got["token_ids"] if t != 2], skip_special_tokens=True)


def test_scenario_model_by_relative_path(tiny):
    """Sizes counted by hand: Llama layer of hidden 64, 4 heads of 16, 2 KV heads, ffn 96 at
    float32; the Qwen2 layer adds q/k/v biases (64 + 2 * 32)."""
    from splitroom.scenario import load

    layer = 2 * 64 + 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 96  # norms, q+o, k+v, gate/up/down
    for key, path, extra, head in (("gguf", "tiny-llama.gguf", 0, 0), ("safetensors", "tiny-qwen2", 128, VOCAB * 64)):
        y = tiny["root"] / f"{key}.yaml"
        y.write_text(f"model: {{{key}: {path}}}\ncontext: 100\ndevices:\n  - {{id: a, lends: 10 MB}}\n")
        m = load(y).model
        assert (m.layers, m.hidden) == (4, 64)
        assert m.layer_bytes == 4 * (layer + extra)
        assert m.embedding_bytes == 4 * VOCAB * 64 and m.head_bytes == 4 * head
        assert m.kv_bytes_per_token == 2 * 2 * 16 * 2  # K and V, 2 heads of 16, 2 bytes (f16 record)
        assert m.residual_bytes_per_token == 64 * 4
        assert m.source == f"{key}:{(tiny['root'] / path).resolve()}"


@pytest.mark.parametrize("args,needle", [
    (["generate", "--model", "/no/such/model.gguf", "hi"], "no such file or directory"),
    (["generate", "--model", "{txt}", "hi"], "is not a GGUF file"),
    (["generate", "--model", "{gemma}", "hi"], "unsupported architecture 'gemma'"),
    (["generate", "--model", "{gguf}"], "give a PROMPT"),
    (["generate", "--model", "{gguf}", "--ids", "1,x"], "--ids"),
    (["generate", "--model", "{gguf}", "--ids", "1,99999"], "outside the vocabulary"),
    (["plan", "{missing_yaml}"], "model.gguf"),
    (["run", "{yaml}", "--real", "--model", "/no/such/dir"], "no such file or directory"),
])
def test_bad_models_one_line_exit_2(tiny, args, needle):
    root = tiny["root"]
    (root / "notes.txt").write_text("not a model")
    w = gguf.GGUFWriter(str(root / "gemma.gguf"), "gemma")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    (root / "missing.yaml").write_text("model: {gguf: nowhere.gguf}\ndevices:\n  - {id: a, lends: 1 GB}\n")
    (root / "ok.yaml").write_text("devices:\n  - {id: a, lends: 1 GB}\n")
    subs = {"{txt}": str(root / "notes.txt"), "{gemma}": str(root / "gemma.gguf"), "{gguf}": str(tiny["gguf"]),
            "{missing_yaml}": str(root / "missing.yaml"), "{yaml}": str(root / "ok.yaml")}
    r = _cli(*[subs.get(a, a) for a in args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("[")]
    assert len(lines) == 1 and needle in lines[0], r.output


def test_gguf_cache_is_keyed_by_the_file(tiny, tmp_path, monkeypatch):
    """SPLITROOM_GGUF pointing at another file (or the same file rewritten) never reuses a conversion."""
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_gguf(tiny["model"], a, name="model-a")
    small = make_model(transformers.LlamaConfig(**dict(SHAPE, num_hidden_layers=2), tie_word_embeddings=True), 3)
    write_gguf(small, b, name="model-b")
    monkeypatch.setenv("SPLITROOM_GGUF", str(a))
    da = ensure_safetensors(progress=None)
    monkeypatch.setenv("SPLITROOM_GGUF", str(b))
    db = ensure_safetensors(progress=None)
    assert da != db
    from runtime.config import ModelConfig
    assert (ModelConfig.load(da).n_layers, ModelConfig.load(db).n_layers) == (4, 2)
    time.sleep(0.01)
    write_gguf(small, a, name="model-a2")  # a rewritten: same path, new identity
    os.utime(a, ns=(time.time_ns(), time.time_ns()))
    monkeypatch.setenv("SPLITROOM_GGUF", str(a))
    da2 = ensure_safetensors(progress=None)
    assert da2 != da and ModelConfig.load(da2).n_layers == 2


@pytest.mark.slow
def test_real_room_runs_a_gguf_by_path(tiny, tmp_path):
    """`run --real --loopback --model tiny.gguf`: two device processes over WebRTC, layers pinned
    2 + 2; the answer's ids are transformers' greedy ids of the chat prompt, ended by eos 2."""
    from planner.deal import deal
    from splitroom.real import run_real
    from splitroom.scenario import load

    y = tmp_path / "room.yaml"
    y.write_text(f"""model: {{gguf: {tiny['gguf']}}}
context: 256
devices:
  - {{id: a, lends: 50 MB}}
  - {{id: b, lends: 50 MB}}
stages:
  - {{device: a, layers: 1-2}}
  - {{device: b, layers: 3-4}}
workload: {{questions: 1, answer_tokens: {STEPS}, prompts: ["Name a colour."]}}
""")
    scn = load(y)
    d = deal(scn.devices, scn.model, scn.options)
    res = run_real(scn, d, netns=False, timeout_s=120, log=lambda s: None)
    ids = ChatTokenizer.from_gguf(tiny["gguf"]).encode_chat("Name a colour.")
    _, ref = greedy_reference(tiny["model"], ids, STEPS)
    assert res.answers[0]["token_ids"] == [t for t in _until_stop(ref) if t != 2]
