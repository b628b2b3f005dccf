"""Limits on what a user's file may make this process read or walk: a scenario, a
calibration profile, a ``workload.sample``. A leaf module (no splitroom imports), so both
splitroom.scenario and splitroom.calibration use it without importing each other."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

#: Largest scenario (or calibration profile) file read, in bytes: a file that never ends
#: (``/dev/zero``, ``/dev/urandom``) is refused after this much, not read into memory
MAX_FILE_BYTES = 16_000_000
#: Largest calibration profile once YAML aliases are expanded (values): the profiles on
#: main hold 0.4-11 thousand, each workload.sample's walks add a few thousand
MAX_PROFILE_VALUES = 2_000_000


def read_text_capped(path: str | Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of ``path``, reading at most ``limit`` + 1 bytes, so a device or a
    pipe that never ends (whose ``st_size`` is 0) cannot fill memory; a byte-order mark
    at the start is dropped. Raises OSError (``strerror`` "larger than N bytes" past
    ``limit``), UnicodeDecodeError, or ValueError (a NUL in the name), as
    ``Path.read_text`` does."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes")
    return data.decode("utf-8-sig")


def size_problem(data: Any, limit: int, max_depth: int) -> str | None:
    """What is too big about loaded YAML ``data``: more than ``limit`` values once aliases
    are expanded (every visit of a shared node counts), or nesting deeper than
    ``max_depth``; None when neither. Stops counting at the limit, so it takes at most
    ``limit`` steps: an alias bomb stops here, before anything else walks it."""
    count = 0
    stack = [(data, 0)]
    while stack:
        v, depth = stack.pop()
        count += 1
        if count > limit:
            return f"more than {limit} values once YAML aliases are expanded (an alias bomb?)"
        if depth > max_depth:
            return f"nested more than {max_depth} levels deep"
        if isinstance(v, dict):
            for k, x in v.items():
                stack.append((k, depth + 1))
                stack.append((x, depth + 1))
        elif isinstance(v, (list, tuple, set)):
            stack.extend((x, depth + 1) for x in v)
    return None
