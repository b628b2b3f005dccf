"""Quantities with units, as people write them in scenario files.

Parsing is done by pint with a registry of its own that knows only what a room needs,
so that a size and a time can never be mixed up and a bare number is rejected:
sizes (``96 GiB``, ``4 GB``, ``512 MiB``, ``10 KB``), times (``20 ms``, ``1.5 s``,
``250 us``), rates (``273 GB/s``, ``1 Gbit/s``), compute (``100 TFLOPS``) and prices
(``1.20 USD/h``). Decimal prefixes are powers of 1000, binary ones (Ki, Mi, Gi, Ti)
powers of 1024, as in IEC 80000-13.

The plain forms people write almost always (a number, a space, one unit of the kind:
``24 GiB``, ``20 ms``, ``273 GB/s``, ``100 TFLOPS``, ``1.20 USD/h``) are read by
:func:`_plain` with the same arithmetic pint does (the number times the unit's factor,
as an int while both are ints) and give the same float bit for bit
(tests/unit/test_units_plain.py checks them against pint); anything else goes to pint.
So a process whose scenario holds only plain forms never imports pint (about 0.1 s of
start-up: it imports numpy and scipy too).
"""

from __future__ import annotations

import functools
import math
import re
import reprlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pint is imported where a value is not a plain form (module doc)
    import pint

_DEFINITIONS = """
second = [time] = s = sec
minute = 60 * second = min
hour = 60 * minute = h = hr
byte = [information] = B
bit = byte / 8 = b
flop = [compute] = FLOP
FLOPS = flop / second
USD = [currency]
""".strip().splitlines()

_PREFIXES = {
    "n": 1e-9, "u": 1e-6, "µ": 1e-6, "m": 1e-3,
    "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}


#: A quantity is a number first, then its unit: "24 GiB", "1.5 s", ".5 ms", "1e3 B".
_NUMBER_THEN_UNIT = re.compile(r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*[^\s\d]")


class QuantityError(ValueError):
    """A value is not a quantity of the expected kind (message says what was expected)."""


@functools.lru_cache(maxsize=1)
def registry() -> pint.UnitRegistry:
    """The unit registry (built once; about 0.1 s with pint's import)."""
    import pint
    ureg = pint.UnitRegistry(None, autoconvert_offset_to_baseunit=False)
    for line in _DEFINITIONS:
        ureg.define(line)
    # Prefixed units spelled out explicitly so that e.g. "KB" and "kB" both mean 1000 B
    # and "ms" is never read as mega-seconds.
    for base in ("byte", "bit", "second", "FLOPS"):
        sym = {"byte": "B", "bit": "bit", "second": "s", "FLOPS": "FLOPS"}[base]
        for p, f in _PREFIXES.items():
            if base == "second" and p not in ("n", "u", "µ", "m"):
                continue
            if base != "second" and p in ("n", "u", "µ", "m"):
                continue
            name = f"{p}{sym}"
            try:
                ureg.define(f"{name} = {f!r} * {base}")
            except pint.errors.RedefinitionError:  # pragma: no cover
                pass
    return ureg


_KINDS = {
    "size": ("B", "a size like '24 GiB'"),
    "time": ("s", "a time like '20 ms'"),
    "rate": ("B / s", "a rate like '1 Gbit/s' or '273 GB/s'"),
    "compute": ("FLOPS", "compute like '100 TFLOPS'"),
    "price": ("USD / hour", "a price like '1.20 USD/h'"),
}


#: a number (no sign, no leading zero, Python's literal forms), spaces, one unit word
_PLAIN = re.compile(r"\s*((?:0|[1-9]\d*)(\.\d*)?([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?) *([A-Za-zµ]+(/[A-Za-z]+)?)\s*")


def _plain_factors() -> dict[str, dict[str, int | float]]:
    """kind -> {unit as written: its factor to the kind's base unit, as pint's registry
    above has it (ints where the definitions are ints, floats otherwise)}."""
    sizes: dict[str, int | float] = {"B": 1, "byte": 1, "bit": 0.125, "b": 0.125}
    flops: dict[str, int | float] = {"FLOPS": 1}
    for p, f in _PREFIXES.items():
        if p in ("n", "u", "µ", "m"):
            continue
        sizes[f"{p}B"] = f
        sizes[f"{p}bit"] = f * 0.125
        flops[f"{p}FLOPS"] = f
    times: dict[str, int | float] = {"s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600, "hr": 3600,
                                     "hour": 3600}
    for p in ("n", "u", "µ", "m"):
        times[f"{p}s"] = _PREFIXES[p]
    return {"size": sizes, "time": times, "compute": flops,
            "rate": {f"{u}/s": float(f) for u, f in sizes.items()},
            "price": {"USD/h": 1.0, "USD/hr": 1.0, "USD/hour": 1.0}}


_PLAIN_FACTORS = _plain_factors()


def _plain(value: str, kind: str) -> float | None:
    """``value`` in the kind's base units when it is a plain form (module doc), computed
    as pint computes it; None for any other form (pint then reads it)."""
    m = _PLAIN.fullmatch(value)
    if m is None:
        return None
    number, point, exp, _, unit, per = m.groups()
    factor = _PLAIN_FACTORS[kind].get(unit)
    if factor is None:
        return None
    # pint keeps a whole number of one unit an int; a quotient of units makes it a float
    n = int(number) if point is None and exp is None and per is None and number[0] != "." else float(number)
    return float(n * factor)


_SHOW = reprlib.Repr()
_SHOW.maxstring = 60
_SHOW.maxother = 60
_SHOW.maxlevel = 2
_SHOW.maxlist = _SHOW.maxdict = _SHOW.maxtuple = _SHOW.maxset = 4


def show(value: object) -> str:
    """``repr(value)`` cut short (at most about 60 characters per string, 4 items per
    list or mapping, 2 levels deep), for one-line error messages about user input."""
    try:
        return _SHOW.repr(value)
    except Exception:  # a repr that fails must not hide the error being reported
        return f"<{type(value).__name__}>"


def example(kind: str) -> str:
    """How a quantity of ``kind`` is written, for error messages ("a size like '24 GiB'").

    Raises KeyError for an unknown kind."""
    return _KINDS[kind][1]


def parse(value: object, kind: str) -> float:
    """Parse ``value`` as a quantity of ``kind`` and return it in base units.

    Base units: size -> bytes, time -> seconds, rate -> bytes/s, compute -> FLOP/s,
    price -> USD per hour. Raises QuantityError when ``value`` is a bare number, not a
    string, a unit without a number, unparsable, of another dimension, not finite, or
    negative.
    """
    unit, example = _KINDS[kind]
    if isinstance(value, bool) or not isinstance(value, str):
        raise QuantityError(f"expected {example}, got {show(value)}")
    if not _NUMBER_THEN_UNIT.match(value):  # "GiB" alone is not 1 GiB; "nan GiB" is no size
        raise QuantityError(f"expected {example}, got {show(value)}")
    x = _plain(value, kind)
    if x is None:
        x = _with_pint(value, unit, example)
    if not math.isfinite(x):
        raise QuantityError(f"expected {example} that is finite, got {show(value)}")
    if x < 0:
        raise QuantityError(f"expected {example} that is not negative, got {show(value)}")
    return x


def _with_pint(value: str, unit: str, example: str) -> float:
    """``value`` converted to ``unit`` by pint's registry; QuantityError when it is not
    a quantity of that dimension."""
    import pint
    ureg = registry()
    try:
        q = ureg.Quantity(value.strip())
    except Exception:
        raise QuantityError(f"expected {example}, got {show(value)}") from None
    if not isinstance(q, pint.Quantity) or q.dimensionless:
        raise QuantityError(f"expected {example}, got {show(value)}")
    try:
        x = float(q.to(unit).magnitude)
    except pint.errors.DimensionalityError:
        raise QuantityError(f"expected {example}, got {show(value)}") from None
    return x
