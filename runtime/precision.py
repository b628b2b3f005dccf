"""How a stage stores its numbers: weights, KV cache, and the residual frames it sends.

One record, :class:`Precision`, chosen in the scenario (``weights``, ``kv_cache``,
``residual``: docs/scenario.md) and carried to every device process in its NodeConfig, so
the planner counts exactly what the runtime allocates and sends:

* ``weights``: ``f32`` (4 bytes per weight), ``f16`` (IEEE half, 2 bytes), ``q8`` (int8 with
  one float32 scale per output row, ``max|row| / 127``; counted as 9 bits per weight: the wgpu
  backend stores the scale once per 32 weights, numpy once per row, 8 + 32/in bits). Norm
  vectors stay float32 whatever this says. The output head (and
  with tied embeddings, the embedding) is stored in the same format. ``gguf``: every tensor
  held as the GGUF file stores it (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K blocks, F16, F32:
  :mod:`runtime.gguf_blocks`), unpacked inside the matrix products; the bytes held are the
  file's bytes for the range (the planner reads them from the file, not from a bits-per-weight).
* ``kv``: ``f32`` or ``f16`` keys and values (attention itself computes in float32).
* ``residual``: the dtype of residual frames on the wire, ``f32`` or ``f16`` (half the
  bytes per hop); a stage always computes in float32 and the codec converts.

Every computation is float32; only storage changes. The error each choice adds against the
float32 reference is measured by ``scripts/precision_error.py`` (docs/precision.md).

Backends declare what they store in :data:`BACKEND_SUPPORT`; :func:`check_backend` refuses
anything else with one line, so a backend never silently computes in another precision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WEIGHTS = ("f32", "f16", "q8", "gguf")
KV = ("f32", "f16")
RESIDUAL = ("f32", "f16")

#: Bits per weight each ``weights`` choice stores at most (``gguf``: the file's own, not listed) (q8: 8 + a 32-bit scale per 32 weights
#: on wgpu; numpy keeps one scale per row, 8.06 bits for SmolLM2's 576-wide rows).
WEIGHT_BITS = {"f32": 32.0, "f16": 16.0, "q8": 9.0}
#: Bytes per stored K or V value.
KV_BYTES = {"f32": 4, "f16": 2}
#: Bytes per residual value on the wire.
RESIDUAL_BYTES = {"f32": 4, "f16": 2}

#: What each backend can store: ``{backend: (weights choices, kv choices)}``. Residual
#: frames are converted by the codec, so every backend takes both residual choices.
BACKEND_SUPPORT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "numpy": (WEIGHTS, KV),
    "wgpu": (WEIGHTS, ("f32",)),  # weights unpacked to float32 in the WGSL loads; KV float32
}


class PrecisionError(ValueError):
    """A precision that does not exist, or that a backend does not implement (one line)."""


@dataclass(frozen=True)
class Precision:
    """Storage of one stage: ``weights`` in :data:`WEIGHTS`, ``kv`` in :data:`KV`,
    ``residual`` in :data:`RESIDUAL`. The default is float32 everywhere (the reference).

    Raises:
        PrecisionError: a value outside those choices.
    """

    weights: str = "f32"
    kv: str = "f32"
    residual: str = "f32"

    def __post_init__(self) -> None:
        for name, allowed in (("weights", WEIGHTS), ("kv", KV), ("residual", RESIDUAL)):
            v = getattr(self, name)
            if v not in allowed:
                raise PrecisionError(f"precision {name} must be one of {', '.join(allowed)}, got {v!r}")

    @property
    def is_reference(self) -> bool:
        """True for float32 weights, KV and residual (the reference precision)."""
        return self == FLOAT32

    def to_json(self) -> dict:
        """``{"weights": ..., "kv": ..., "residual": ...}``."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict | None) -> "Precision":
        """Inverse of :meth:`to_json`; ``None`` or ``{}`` is float32.

        Raises:
            PrecisionError: unknown keys or values.
        """
        d = dict(d or {})
        unknown = set(d) - {"weights", "kv", "residual"}
        if unknown:
            raise PrecisionError(f"unknown precision keys: {', '.join(sorted(unknown))}")
        return cls(**d)

    def label(self) -> str:
        """Short text for tables, e.g. ``weights q8, KV f16, residual f16``."""
        return f"weights {self.weights}, KV {self.kv}, residual {self.residual}"


FLOAT32 = Precision()


def check_backend(backend: str, p: Precision) -> None:
    """Refuse a precision ``backend`` cannot store.

    Raises:
        PrecisionError: e.g. ``the wgpu backend keeps the KV cache as f32 only; KV f16 needs
            another backend``.
    """
    weights, kv = BACKEND_SUPPORT.get(backend, (WEIGHTS, KV))
    if p.weights not in weights:
        raise PrecisionError(f"the {backend} backend stores weights as {', '.join(weights)} only; "
                             f"weights {p.weights} needs another backend (numpy has {', '.join(WEIGHTS)})")
    if p.kv not in kv:
        raise PrecisionError(f"the {backend} backend keeps the KV cache as {', '.join(kv)} only; "
                             f"KV {p.kv} needs another backend (numpy has {', '.join(KV)})")
