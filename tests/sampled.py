"""The sampled answer a seed stands for, computed for tests without the scheduler or
planner.sampling (an independent reference for the room's sampled answers)."""

from __future__ import annotations

from runtime.backends import StageSpec, make_stage
from runtime.tokenizer import ChatTokenizer
from runtime.weights import ensure_safetensors


def sampled_reference(prompt: str, temperature: float, seed: int, max_new: int) -> list[int]:
    """The sampled answer a seed stands for, computed here without the scheduler or
    planner.sampling: token j is where ``v_j`` (the second uniform of pair j of a PCG64
    stream seeded ``seed``) falls in the cumulative softmax(logits / temperature) of one
    whole-model stage."""
    import numpy as np
    md = ensure_safetensors()
    tok = ChatTokenizer.from_dir(md)
    st = make_stage("numpy", md, StageSpec(0, 30, True))
    ids = tok.encode_chat(prompt)
    v = np.random.Generator(np.random.PCG64(seed)).random((max_new, 2))[:, 1]
    h = st.forward(st.embed(ids), 0)
    out: list[int] = []
    for j in range(max_new):
        z = st.head(h[-1:])[0].astype(np.float64) / temperature
        c = np.cumsum(np.exp(z - z.max()))
        t = int(np.searchsorted(c, v[j] * c[-1], side="right"))
        if t in tok.stop_ids:
            break
        out.append(t)
        h = st.forward(st.embed([t]), len(ids) + j)
    return out
