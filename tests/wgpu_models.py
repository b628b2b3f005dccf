"""Small random checkpoints for the wgpu tests (tests/integration/test_wgpu_*.py)."""

from __future__ import annotations

import numpy as np

from runtime.config import ModelConfig
from runtime.weights import range_tensor_names


def random_checkpoint(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Every tensor ``cfg`` needs (biases, q/k norms and an untied head where it has them), float32:
    matrices N(0, 1/fan-in) so activations neither vanish nor blow up (the embedding x3, so greedy
    sequences move), norm weights 1 + N(0, 0.1), biases N(0, 0.25)."""
    rng = np.random.default_rng(seed)
    H, F, KVD, QD, D = cfg.hidden, cfg.ffn, cfg.kv_dim, cfg.q_dim, cfg.head_dim
    shapes = {"input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
              "self_attn.q_proj.weight": (QD, H), "self_attn.k_proj.weight": (KVD, H), "self_attn.v_proj.weight": (KVD, H),
              "self_attn.q_proj.bias": (QD,), "self_attn.k_proj.bias": (KVD,), "self_attn.v_proj.bias": (KVD,),
              "self_attn.o_proj.weight": (H, QD), "self_attn.o_proj.bias": (H,),
              "self_attn.q_norm.weight": (D,), "self_attn.k_norm.weight": (D,),
              "mlp.gate_proj.weight": (F, H), "mlp.up_proj.weight": (F, H), "mlp.down_proj.weight": (H, F)}
    out = {}
    for name in range_tensor_names(cfg, 0, cfg.n_layers, True, True):
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            shape = (cfg.vocab, H)
        elif name == "model.norm.weight":
            shape = (H,)
        else:
            shape = shapes[name.split(".", 3)[3]]
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 1:
            out[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[1]) * (3.0 if "embed" in name else 1.0)).astype(np.float32)
    return out


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """``max |a - b| / max |b|``."""
    return float(np.abs(a - b).max() / np.abs(b).max())


def run_compute(device, src: str, buffers: dict, out_binding: int, out_nbytes: int, groups: int,
                uniform: frozenset = frozenset()) -> np.ndarray:
    """Run WGSL ``src``'s ``main`` once over ``groups`` workgroups and read its output back.

    ``buffers``: ``{binding: array}``, each array uploaded as a storage buffer (its bytes as
    they are; a binding in ``uniform`` as a uniform buffer); the output is a new storage
    buffer of ``out_nbytes`` bytes at ``out_binding``. Returns the output's bytes as float32.
    """
    import wgpu

    U = wgpu.BufferUsage
    pipe = device.create_compute_pipeline(layout="auto", compute={"module": device.create_shader_module(code=src),
                                                                  "entry_point": "main"})
    out = device.create_buffer(size=out_nbytes, usage=U.STORAGE | U.COPY_SRC)
    bufs = {k: device.create_buffer_with_data(data=a, usage=U.UNIFORM if k in uniform else U.STORAGE)
            for k, a in buffers.items()}
    bufs[out_binding] = out
    bg = device.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                  entries=[{"binding": k, "resource": {"buffer": b}} for k, b in bufs.items()])
    enc = device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    cp.dispatch_workgroups(groups)
    cp.end()
    device.queue.submit([enc.finish()])
    return np.frombuffer(device.queue.read_buffer(out), np.float32)
