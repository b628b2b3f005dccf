"""Logging that a hostile client cannot flood or fill with what it sent.

:class:`OneLine` is a :class:`logging.Filter`: every record it passes is one line with
no traceback and no exception text (an exception's text may hold the raw request, and
so a prompt); only the exception's type and its HTTP status, when it has one, are
kept. At most ``per_s`` records a second pass; the rest are counted and the count is
said at the start of the next line that passes.

:func:`rotate_into` copies a child process's output, line by line, into a
:class:`logging.handlers.RotatingFileHandler` (the file and ``backups`` older ones of
at most ``max_bytes`` each), so a long-lived room's logs stay bounded.
"""

from __future__ import annotations

import logging
import logging.handlers
import threading
import time
from typing import IO, Callable

#: log lines per second a :class:`OneLine` filter lets through by default
LINES_PER_S = 10
#: a rotated log file's size, bytes, and the older files kept beside it
LOG_FILE_BYTES = 10 * 1024 * 1024
LOG_BACKUPS = 2


class OneLine(logging.Filter):
    """One line per record, no exception text, at most ``per_s`` records a second
    (module doc). ``clock``: seconds (``time.monotonic``). ``suppressed``: records held
    back in the current second; ``suppressed_total``: all so far."""

    def __init__(self, per_s: int = LINES_PER_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.per_s = per_s
        self.clock = clock
        self._window = None
        self._used = 0
        self.suppressed = 0
        self.suppressed_total = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = int(self.clock())
        held = 0
        if now != self._window:
            held, self._window, self._used, self.suppressed = self.suppressed, now, 0, 0
        if self._used >= self.per_s:
            self.suppressed += 1
            self.suppressed_total += 1
            return False
        self._used += 1
        text = record.getMessage().replace("\r", " ").replace("\n", " ")[:300]
        exc = record.exc_info
        if exc:
            e = exc[1] if isinstance(exc, tuple) else exc
            if isinstance(e, BaseException):
                status = getattr(e, "code", None) if isinstance(getattr(e, "code", None), int) else None
                text += f": {type(e).__name__}" + (f" (HTTP {status})" if status else "")
        if held:
            text = f"({held} similar lines in the last second not logged) {text}"
        record.msg, record.args = text, None
        record.exc_info = record.exc_text = record.stack_info = None
        return True


def one_line_logger(name: str, per_s: int = LINES_PER_S) -> logging.Logger:
    """The logger ``name`` with a :class:`OneLine` filter (added once)."""
    lg = logging.getLogger(name)
    if not any(isinstance(f, OneLine) for f in lg.filters):
        lg.addFilter(OneLine(per_s))
    return lg


def rotate_into(stream: IO[bytes], path: str, max_bytes: int = LOG_FILE_BYTES,
                backups: int = LOG_BACKUPS) -> threading.Thread:
    """Copy ``stream`` (a child's stdout/stderr pipe) line by line into ``path``,
    rotated at ``max_bytes`` with ``backups`` older files (``path.1``...), until its end;
    returns the (daemon) thread doing it."""
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups,
                                                   encoding="utf-8", errors="replace")
    handler.setFormatter(logging.Formatter("%(message)s"))

    def copy() -> None:
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                handler.emit(logging.LogRecord("child", logging.INFO, path, 0, line, None, None))
        finally:
            handler.close()

    t = threading.Thread(target=copy, name=f"log {path}", daemon=True)
    t.start()
    return t
