"""``frozen``: ``@dataclass(frozen=True)`` whose ``__init__`` is about twice as fast.

A frozen dataclass's generated ``__init__`` sets each field with
``object.__setattr__`` (its own ``__setattr__`` refuses); that is most of the cost of
making one, and the scheduler makes several per lap and per stage (events and
commands, planner.protocol; frame headers, planner.frames), for the simulator and
the real room alike. This decorator replaces that ``__init__`` with one that writes
the fields into the new instance's ``__dict__`` directly: the same signature,
defaults, equality, hashing, repr, immutability (assignment still raises
``dataclasses.FrozenInstanceError``), ``dataclasses.fields``/``replace`` and pickling.
Classes it cannot speed up keep the ordinary ``__init__``: a ``__post_init__``, a
``default_factory``, an ``init=False`` field, ``slots``, or an ``InitVar``.
"""

from __future__ import annotations

import dataclasses
import inspect

__all__ = ["frozen"]


def frozen(cls: type) -> type:
    """``dataclass(frozen=True)(cls)`` with a fast ``__init__`` (module doc)."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    fs = dataclasses.fields(cls)
    init_params = list(inspect.signature(cls.__init__).parameters)[1:]  # an InitVar adds one
    if (hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__ or init_params != [f.name for f in fs]
            or any(not f.init or f.kw_only or f.name.startswith("_fastdc")
                   or f.default_factory is not dataclasses.MISSING for f in fs)):
        return cls
    params, body, env = [], [], {}
    for f in fs:
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            env[f"_dflt_{f.name}"] = f.default
            params.append(f"{f.name}=_dflt_{f.name}")
        body.append(f"    _fastdc_d[{f.name!r}] = {f.name}")
    # the local's name cannot be a field's: fields starting with "_fastdc" fall back above
    src = f"def __init__(self, {', '.join(params)}):\n    _fastdc_d = self.__dict__\n" + "\n".join(body or ["    pass"])
    exec(src, env)  # noqa: S102 - generated from the field names, as dataclasses itself does
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls
