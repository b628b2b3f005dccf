"""One function run in a forked child process while this one works on (composition root).

``simulate`` of a speculating room predicts the same room twice: speculative, and plain
beside it (splitroom/speculation_check.py). The two simulations share nothing, so on a
machine with an idle CPU the plain one runs in a child forked before the speculative one
starts, and the whole process takes about one simulation's time instead of two. The
child computes exactly what this process would (same code, same inputs, its own seeded
generators), and hands its value back pickled through a pipe.

Linux only (fork is its start method; elsewhere :func:`start` runs nothing and the
caller computes the value itself, as it does when the child fails).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from typing import Any, Callable

__all__ = ["ChildFailed", "Forked", "idle_cpus", "may_fork", "start"]


class ChildFailed(RuntimeError):
    """The child raised, died, or sent nothing readable; the message says which."""


class Forked:
    """A child process computing ``fn(*args)``; :meth:`result` waits for its value. Use
    as a context manager (or call :meth:`close`): a child still running is killed."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.pid: int | None = None
        self._read: int | None = None
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
            os.close(r)
            code = 0
            try:
                try:
                    data = pickle.dumps((True, fn(*args)), protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException as e:  # noqa: BLE001 -- any failure is the parent's to handle
                    data = pickle.dumps((False, f"{type(e).__name__}: {e}"))
                    code = 1
                view = memoryview(data)
                while view:
                    view = view[os.write(w, view):]
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self._read = pid, r

    def result(self) -> Any:
        """The child's ``fn(*args)`` (waits for it). Raises ChildFailed when the child
        raised (its exception's type and message), died or sent nothing readable."""
        if self._read is None:
            raise ChildFailed("the child's value was already taken")
        chunks = []
        try:
            while True:
                b = os.read(self._read, 1 << 16)
                if not b:
                    break
                chunks.append(b)
        finally:
            self.close()
        try:
            ok, value = pickle.loads(b"".join(chunks))
        except Exception:
            raise ChildFailed("the child sent nothing readable (it died)") from None
        if not ok:
            raise ChildFailed(value)
        return value

    def close(self) -> None:
        """Kill the child if it still runs, and reap it."""
        r, self._read = self._read, None
        if r is not None:
            os.close(r)
        pid, self.pid = self.pid, None
        if pid is not None:
            try:
                if os.waitpid(pid, os.WNOHANG) == (0, 0):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except ChildProcessError:  # pragma: no cover -- already reaped
                pass

    def __enter__(self) -> "Forked":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def idle_cpus() -> int:
    """CPUs this process may run on that nothing else runs on at this instant: the CPUs
    of its affinity less the tasks the kernel counts runnable now (the fourth field of
    /proc/loadavg, which counts this process too). A sample of one instant, not the
    load average: a process that simulates for a second would raise the one-minute
    average itself, so back-to-back runs of it would each see the CPUs its predecessor
    used as busy. 0 where it is not known (not Linux)."""
    if sys.platform != "linux":
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
        with open("/proc/loadavg", encoding="ascii") as f:
            runnable = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError, AttributeError):  # pragma: no cover
        return 0
    return max(cpus - runnable, 0)


def may_fork() -> bool:
    """Whether a caller that can compute the value itself should fork for it now: a CPU is
    idle (:func:`idle_cpus`) and this process runs no other thread. A child forked while
    another thread holds a lock (logging's, the import lock, a C library's) inherits the
    lock held by a thread that does not exist there, and waits for it for ever; a
    command-line process is single-threaded here, a test process or a server may not be."""
    return threading.active_count() == 1 and idle_cpus() >= 1


def start(fn: Callable[..., Any], *args: Any) -> Forked | None:
    """``fn(*args)`` in a forked child (:class:`Forked`), or None where processes are
    not forked (not Linux): the caller then computes it itself. ``fn``'s value must
    pickle."""
    if sys.platform != "linux":
        return None
    return Forked(fn, *args)
