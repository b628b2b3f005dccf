"""Models by path: a checkpoint (GGUF file or safetensors directory) -> the planner's
:class:`planner.model.ModelSpec` and the runtime's model directory.

Used by scenarios (``model: {gguf: PATH}`` / ``{safetensors: DIR}``) and by ``--model PATH``
on ``generate``, ``run --real``, ``serve`` and ``join``. The architecture is read from the
checkpoint's metadata only (:func:`runtime.config.describe`: GGUF keys, or config.json), so
planning a room never dequantizes anything; the real runtime converts once
(:func:`runtime.weights.prepare_model`). The bundled SmolLM2-135M-Instruct stays the default
(catalog id :data:`planner.model.BUNDLED_MODEL_ID`).
"""

from __future__ import annotations

from pathlib import Path

from planner.model import BUNDLED_MODEL_ID, ModelSpec, spec_from_architecture


class ModelError(ValueError):
    """A model path that cannot be used: missing, not a checkpoint, or an architecture the
    runtime does not compute (the message is one line)."""


def _one_line(e: BaseException) -> str:
    text = str(e)
    return text.splitlines()[0] if text else type(e).__name__


def _gguf_header(path: Path) -> tuple[dict, list[str], object]:
    """``(metadata, tensor names, rope_freqs values or None)`` of a GGUF without reading its
    large arrays (the vocabulary's strings stay unread: only their count is kept)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    meta = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if f.types and f.types[0] == gguf.GGUFValueType.ARRAY and len(f.data) > 256:
            meta[key] = [None] * len(f.data)  # a count is all the architecture needs
        else:
            meta[key] = f.contents()
    names = [t.name for t in reader.tensors]
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    vals = None if freqs is None else np.asarray(gguf.quants.dequantize(freqs.data, freqs.tensor_type)).ravel()
    return meta, names, vals


def checkpoint_kind(path: Path) -> str:
    """``"gguf"`` for a file starting with the GGUF magic, ``"safetensors"`` for a directory
    with a config.json. Raises ModelError for anything else."""
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF":
                return "gguf"
        raise ModelError(f"{path} is not a GGUF file (give a .gguf file or a safetensors directory)")
    if path.is_dir():
        if (path / "config.json").is_file():
            return "safetensors"
        raise ModelError(f"{path} has no config.json (give a .gguf file or a safetensors directory)")
    raise ModelError(f"{path}: no such file or directory")


def read_config(path: str | Path):
    """The runtime's :class:`runtime.config.ModelConfig` of a checkpoint, from its metadata.

    Raises:
        ModelError: bad path, unreadable file, or an architecture the runtime does not compute.
    """
    import json

    from runtime.config import ModelConfig, UnsupportedModel

    p = Path(path).expanduser()
    kind = checkpoint_kind(p)
    try:
        if kind == "gguf":
            meta, names, freqs = _gguf_header(p)
            cfg = ModelConfig.from_gguf_fields(meta, names, freqs)
            if not cfg.name:
                import dataclasses
                cfg = dataclasses.replace(cfg, name=p.stem)
            return cfg
        if not isinstance(json.loads((p / "config.json").read_text()), dict):
            raise ModelError(f"{p}: config.json is not a mapping of keys")
        return ModelConfig.load(p)
    except UnsupportedModel as e:
        raise ModelError(f"{p}: {e}") from None
    except ModelError:
        raise
    except Exception as e:  # an untrusted file: whatever its parser raises is one line, never a traceback
        raise ModelError(f"{p}: cannot read it as a {kind} model ({_one_line(e)})") from None


def spec_from_checkpoint(path: str | Path, kind: str | None = None, bits_per_weight: float | None = 32.0) -> ModelSpec:
    """The planner's model of a checkpoint: weights at ``bits_per_weight`` (32: the runtime's
    float32; 16 and 9 for its f16 and q8 storage; ``None``: held as the GGUF stores them, the
    file's own bytes per layer, :func:`stored_spec`), float32 residuals, ``source`` naming the
    path (absolute) for the real runtime. ``kind``: ``gguf`` or ``safetensors`` when the
    caller expects one (a mismatch is an error).

    Raises:
        ModelError: as :func:`read_config`; ``bits_per_weight=None`` for a safetensors directory.
    """
    p = Path(path).expanduser().resolve()
    found = checkpoint_kind(p)
    if kind is not None and kind != found:
        raise ModelError(f"{p} is a {'GGUF file' if found == 'gguf' else 'safetensors directory'}, "
                         f"not a {'GGUF file' if kind == 'gguf' else 'safetensors directory'}")
    kind = found
    cfg = read_config(p)
    name = cfg.name or p.stem
    if bits_per_weight is None:
        if kind != "gguf":
            raise ModelError(f"{p} is a safetensors directory: weights gguf (blocks as stored) needs a GGUF file")
        return stored_spec(spec_from_architecture(name, name, cfg.architecture()), p, f"{kind}:{p}")
    spec = spec_from_architecture(name, name, cfg.architecture(bits_per_weight=bits_per_weight))
    import dataclasses
    return dataclasses.replace(spec, source=f"{kind}:{p}")


def stored_spec(spec: ModelSpec, gguf_path: str | Path, source: str | None = None) -> ModelSpec:
    """``spec`` with the weight bytes a stage holds when it keeps ``gguf_path``'s tensors as
    stored (``weights: gguf``): each layer's bytes in the file (``layer_sizes``, their mean
    rounded up as ``layer_bytes``, read per token as ``layer_active_bytes``), the embedding's
    and the own head's; draft layers scaled alike. ``source`` replaces the spec's if given.

    Raises:
        ModelError: the file cannot be read.
    """
    import dataclasses

    import gguf

    from runtime.gguf_blocks import stored_sizes, tensor_table

    try:
        sizes, emb, head = stored_sizes(tensor_table(gguf.GGUFReader(str(gguf_path))), spec.layers)
    except Exception as e:
        raise ModelError(f"{gguf_path}: cannot read its tensors ({_one_line(e)})") from None
    mean = -(-sum(sizes) // len(sizes)) if sizes else 0
    draft = -(-spec.draft_bytes * mean // spec.layer_bytes) if spec.layer_bytes else 0
    return dataclasses.replace(spec, layer_bytes=mean, layer_active_bytes=mean, layer_sizes=sizes,
                               embedding_bytes=emb, head_bytes=head, draft_bytes=draft,
                               source=spec.source if source is None else source)


def model_dir(spec_or_path: ModelSpec | str | Path | None, progress=None, stored: bool = False) -> Path:
    """The runtime's model directory for a scenario's model or a ``--model`` path (``None``:
    the bundled SmolLM2), converting a GGUF once into its cache folder; with ``stored`` (weights
    ``gguf``) a GGUF is not converted: its folder names the file whose blocks stages read
    (:func:`runtime.weights.prepare_native`).

    Raises:
        ModelError: the model has no weights on this machine (a catalog model other than
            the bundled one, an inline model), or the checkpoint cannot be used.
    """
    from runtime.config import UnsupportedModel
    from runtime.weights import WeightsError, ensure_safetensors, find_gguf, prepare_model, prepare_native

    kw = {} if progress is None else {"progress": progress}
    if isinstance(spec_or_path, ModelSpec):
        if spec_or_path.source:
            path = spec_or_path.source.split(":", 1)[1]
        elif spec_or_path.id == BUNDLED_MODEL_ID:
            path = None
        else:
            raise ModelError(f"the model {spec_or_path.id!r} has no weights here: real rooms run the bundled "
                             f"{BUNDLED_MODEL_ID} or a model given by path "
                             "(model: {gguf: PATH} or {safetensors: DIR})")
    else:
        path = spec_or_path
    try:
        if stored:
            p = find_gguf() if path is None else Path(path).expanduser()
            if p.is_dir():
                raise ModelError(f"{p} is a safetensors directory: weights gguf (blocks as stored) needs a GGUF file")
            return prepare_native(p, **kw)
        if path is None:
            return ensure_safetensors(**kw)
        return prepare_model(Path(path).expanduser(), **kw)  # checks the kind, with checkpoint_kind's messages
    except UnsupportedModel as e:
        raise ModelError(f"{path}: {e}") from None
    except WeightsError as e:
        raise ModelError(str(e)) from None
    except ModelError:
        raise
    except Exception as e:  # converting an untrusted file (e.g. a tensor type gguf cannot dequantize): one line
        raise ModelError(f"{path}: cannot convert it ({_one_line(e)})") from None
