"""splitroom.units reads plain quantities ("24 GiB", "20 ms", "273 GB/s") without pint:
each must be the float pint's registry gives for the same text, bit for bit (pint is
the reference here), and a scenario of plain forms must load without importing pint."""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from splitroom import units

ROOT = Path(__file__).resolve().parents[2]

NUMBERS = ["0", "1", "2", "3", "7", "13", "24", "56", "96", "273", "1000", "123456789", "99999999999999999999",
           "0.1", "0.3", "0.7", "1.5", "1.20", "2.5", "3.14159", "12.75", ".5", ".25", "5.", "0.", "1e3", "2.5e-3",
           "1E3", "7e+2", ".5e1", "1e-9", "4.4e10"]


def _numbers() -> list[str]:
    rng = random.Random(23)
    out = list(NUMBERS)
    for _ in range(60):  # decimals as people type them, and floats' own repr
        out.append(f"{rng.randint(0, 999)}.{rng.randint(0, 99999)}")
        out.append(repr(rng.uniform(0, 1000)))
    return out


def _reference(text: str, kind: str) -> float:
    """What pint's registry makes of ``text`` (the code path before the plain reader)."""
    unit = units._KINDS[kind][0]
    return float(units.registry().Quantity(text.strip()).to(unit).magnitude)


@pytest.mark.parametrize("kind", sorted(units._PLAIN_FACTORS))
def test_plain_forms_equal_pint_bit_for_bit(kind):
    """Every unit of the plain table, with many numbers and spacings: the same float."""
    for unit in units._PLAIN_FACTORS[kind]:
        for n in _numbers():
            for text in (f"{n} {unit}", f"{n}{unit}", f"  {n}  {unit} "):
                fast = units._plain(text, kind)
                assert fast is not None, text
                ref = _reference(text, kind)
                assert fast == ref and math.copysign(1, fast) == math.copysign(1, ref), (text, fast, ref)
                assert units.parse(text, kind) == ref


@pytest.mark.parametrize("text,kind", [
    ("13\tms", "time"), ("1 GiB / s", "rate"), ("013 ms", "time"), ("2 ms * 3", "time"), ("1 Gb", "size"),
    ("3 seconds", "time"), ("1 GB/min", "rate"), ("1_000 B", "size"), ("1 USD/day", "price"),
])
def test_other_forms_go_to_pint(text, kind):
    """Forms outside the plain table are pint's to read (or to refuse) as before."""
    assert units._plain(text, kind) is None
    try:
        ref = _reference(text, kind)
    except Exception:
        with pytest.raises(units.QuantityError):
            units.parse(text, kind)
        return
    assert units.parse(text, kind) == ref


@pytest.mark.parametrize("text,kind,message", [
    ("24 ms", "size", "expected a size like '24 GiB', got '24 ms'"),
    ("1e999 GB", "size", "expected a size like '24 GiB' that is finite, got '1e999 GB'"),
    ("-5 ms", "time", "expected a time like '20 ms' that is not negative, got '-5 ms'"),
    ("20 GB/s", "time", "expected a time like '20 ms', got '20 GB/s'"),
])
def test_errors_unchanged(text, kind, message):
    """The one-line errors are the same whichever reader saw the value."""
    with pytest.raises(units.QuantityError) as e:
        units.parse(text, kind)
    assert str(e.value) == message


def test_plain_scenario_loads_without_pint():
    """Loading a shipped scenario (every quantity in it plain) imports no pint."""
    code = ("import sys; from splitroom.scenario import load; load('scenarios/wan_glm.yaml', "
            "['context=10240', 'decoding.speculative={drafter: model, draft_tokens: 4, draft_cost: 13 ms}']); "
            "print('pint' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
