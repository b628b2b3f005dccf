"""The model host's question queue on disk, so a host that comes back resumes it.

A host started with ``splitroom join --host --queue FILE`` writes each question it
takes to ``FILE`` before asking it and each question's end after it ends. A host
process that dies (killed, crashed, a closed terminal) loses its memory, not the file:
started again with the same ``--queue FILE``, it asks the questions that never ended
first, in their order, then any new ``--ask``. Answers start again from the prompt (the
KV cache died with the process); greedy answers are therefore token for token the
ones the first host would have given.

The file is JSON lines, appended and flushed to disk (``fsync``) one line at a time::

    {"asked": N, "prompt": "..."}        # question N taken (N counts from 0 in the file)
    {"ended": N, "how": "answered"}      # question N ended (answered, refused: ..., ...)

A last line cut short by the crash (no newline) is ignored; any other line that is
not one of these records is an error naming the file and line (nothing is asked then).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["QueueError", "HostQueue"]

#: longest prompt a queue line may hold, characters (a question larger than any context)
MAX_PROMPT_CHARS = 1_000_000


class QueueError(ValueError):
    """A queue file that cannot be read or written; the message is one line."""


@dataclass
class HostQueue:
    """The questions of one queue file: ``prompts[n]`` for every question taken,
    ``ended[n]`` for those that ended (how)."""

    path: Path
    prompts: list[str] = field(default_factory=list)
    ended: dict[int, str] = field(default_factory=dict)
    _cut_at: int | None = None  # length of the file without a last line cut short

    @classmethod
    def open(cls, path: str | Path) -> "HostQueue":
        """Read ``path`` (a missing file is an empty queue). Raises QueueError for a
        file that cannot be read or a malformed line (naming the line)."""
        if not str(path).strip():
            raise QueueError("--queue: give a file name")
        q = cls(Path(path))
        if q.path.exists() and not q.path.is_file():  # a directory, a FIFO (would block), a device
            raise QueueError(f"{path}: the queue must be a regular file")
        try:
            data = q.path.read_bytes() if q.path.exists() else b""
        except OSError as e:
            raise QueueError(f"{path}: cannot read the queue: {e.strerror or e}") from None
        lines = data.split(b"\n")
        if lines and lines[-1] != b"":  # a line the crash cut short: dropped before the next write
            q._cut_at = len(data) - len(lines[-1])
            lines = lines[:-1]
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise QueueError(f"{path}:{i}: not a JSON line") from None
            q._take(rec, f"{path}:{i}")
        return q

    def _take(self, rec, where: str) -> None:
        if isinstance(rec, dict) and set(rec) == {"asked", "prompt"}:
            n, prompt = rec["asked"], rec["prompt"]
            if not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS or not _is_unicode(prompt):
                raise QueueError(f"{where}: prompt must be Unicode text of at most {MAX_PROMPT_CHARS} characters")
            if not _is_index(n) or n != len(self.prompts):
                raise QueueError(f"{where}: asked must be the next question number ({len(self.prompts)})")
            self.prompts.append(prompt)
        elif isinstance(rec, dict) and set(rec) == {"ended", "how"}:
            n, how = rec["ended"], rec["how"]
            if not _is_index(n) or n >= len(self.prompts) or n in self.ended:
                raise QueueError(f"{where}: ended must name a question taken and not yet ended")
            if not isinstance(how, str):
                raise QueueError(f"{where}: how must be text")
            self.ended[n] = how[:1000]
        else:
            raise QueueError(f"{where}: expected {{\"asked\": N, \"prompt\": TEXT}} or {{\"ended\": N, \"how\": TEXT}}")

    def pending(self) -> list[int]:
        """Question numbers taken and not ended, in the order taken."""
        return [n for n in range(len(self.prompts)) if n not in self.ended]

    def take(self, prompt: str) -> int:
        """Write that ``prompt`` is taken; returns its number. Raises QueueError when
        the file cannot be written."""
        n = len(self.prompts)
        self._append({"asked": n, "prompt": prompt})
        self.prompts.append(prompt)
        return n

    def end(self, n: int, how: str) -> None:
        """Write that question ``n`` ended (``how``: answered, refused: ...). Raises
        QueueError when the file cannot be written, KeyError for an unknown or ended ``n``."""
        if not (0 <= n < len(self.prompts)) or n in self.ended:
            raise KeyError(n)
        self._append({"ended": n, "how": str(how)[:1000]})
        self.ended[n] = str(how)[:1000]

    def _append(self, rec: dict) -> None:
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        try:
            if self._cut_at is not None:
                os.truncate(self.path, self._cut_at)
                self._cut_at = None
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise QueueError(f"{self.path}: cannot write the queue: {e.strerror or e}") from None


def _is_unicode(text: str) -> bool:
    """Whether ``text`` is Unicode a tokenizer takes (no lone surrogates such as
    ``"\\ud800"``, which JSON can spell but UTF-8 cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_index(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0
