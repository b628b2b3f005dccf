"""Serving a room: the model host's HTTP side (``splitroom serve``).

* :mod:`runtime.serve.api`: OpenAI chat-completions requests checked, responses built.
* :mod:`runtime.serve.server`: :class:`RoomServer`, the aiohttp application over a
  running host :class:`runtime.room.Node` (chat completions, models, metrics, health).
* :mod:`runtime.serve.host`: the model host's process (``python -m runtime.serve``):
  HTTP up at once, then its layers, the room's connections, and questions from HTTP.

The queue rules stay in the scheduler (planner/scheduler.py: one question at a time, 10
waiting, 2 per asker); HTTP only maps its refusals to 429 and a room that is not ready
(or lost a device) to 503.
"""
