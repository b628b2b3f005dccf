"""What a real room (``splitroom run --real``, ``splitroom serve``) raises when it cannot run:
:class:`RealRunError` (one line for the person), and :class:`DiedWhileLoading` for a
worker whose process ended before the room started."""

from __future__ import annotations


class RealRunError(RuntimeError):
    """The room could not be run (wrong model, a device that failed to start, a timeout)."""


class DiedWhileLoading(RealRunError):
    """A worker's process ended before the room started (before the model host's
    process joined the room): ``device`` and ``how`` it ended (:func:`ended_how`)."""

    def __init__(self, device: str, how: str):
        super().__init__(f"{device} died while loading ({how})")
        self.device = device
        self.how = how
