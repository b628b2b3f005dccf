"""The trace: every event and command with its time, as JSON-ready records.

Both drivers keep a list of ``(t_s, obj)`` pairs, ``obj`` being an event or command of
:mod:`planner.protocol`; :func:`to_record` turns one into a flat JSON object (one JSONL
line) and :func:`from_record` turns it back, so metrics computed from a file written
by the real runtime and from the simulator's memory go through the same code.

Record shape: ``{"t": seconds, "name": "SendFrame", <fields>}``; a frame header is a
nested object with its ``kind`` and ``dtype`` as names; a :class:`planner.sampling.Sampling`
is a nested object of its fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from planner import protocol
from planner.frames import DType, FrameHeader, FrameKind
from planner.sampling import Sampling

_TYPES = {cls.__name__: cls for cls in protocol.EVENTS + protocol.COMMANDS + protocol.RECORDS}


class TraceError(ValueError):
    """A trace record is malformed (unknown name, missing or wrong fields)."""


def _plain(v: Any) -> Any:
    if isinstance(v, FrameHeader):
        return {"kind": FrameKind(v.kind).name, "question_id": v.question_id, "lap_id": v.lap_id, "first_pos": v.first_pos,
                "tokens": v.tokens, "hidden": v.hidden, "dtype": DType(v.dtype).name, "returns": v.returns,
                **({"slot": v.slot} if v.slot else {})}
    if isinstance(v, Sampling):
        return v.to_json()
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, frozenset):
        return sorted(v)
    return v


def _tuples(v: Any) -> Any:
    """JSON lists back to (nested) tuples, as the frozen dataclasses hold them."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


#: fields written only when set: a greedy room's records are as they were before sampling
#: (and a room of one question in flight's, KV cache slot 0; a re-deal after a loss's,
#: no device taken back)
_ONLY_WHEN_SET = {"sampling": None, "uniforms": (), "slot": 0, "back": None}


def to_record(t_s: float, obj: Any) -> dict:
    """``(t_s, event-or-command)`` as a flat JSON-ready dict (``sampling`` and
    ``uniforms`` left out when unset: greedy)."""
    rec = {"t": t_s, "name": type(obj).__name__}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name in _ONLY_WHEN_SET and v == _ONLY_WHEN_SET[f.name]:
            continue
        rec[f.name] = _plain(v)
    return rec


def from_record(rec: dict) -> tuple[float, Any]:
    """Inverse of :func:`to_record`. Raises TraceError for an unknown or malformed record."""
    try:
        cls = _TYPES[rec["name"]]
        t = float(rec["t"])
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in rec:
                if f.default is not dataclasses.MISSING:
                    continue
                raise TraceError(f"{rec['name']} record lacks {f.name!r}")
            v = rec[f.name]
            if f.name == "header":
                v = FrameHeader(FrameKind[v["kind"]], v["question_id"], v["lap_id"], v["first_pos"], v["tokens"],
                                v["hidden"], DType[v["dtype"]], v["returns"], v.get("slot", 0))
            elif f.name == "sampling" and v is not None:
                v = Sampling(**v)
            elif isinstance(v, list):
                v = _tuples(v)
            kwargs[f.name] = v
        return t, cls(**kwargs)
    except TraceError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(f"malformed trace record {rec!r:.120}: {e}") from None


def to_records(trace: Iterable[tuple[float, Any]]) -> list[dict]:
    """A whole trace as records."""
    return [to_record(t, o) for t, o in trace]


def from_records(records: Iterable[dict]) -> list[tuple[float, Any]]:
    """Records back to ``(t_s, obj)`` pairs."""
    return [from_record(r) for r in records]
