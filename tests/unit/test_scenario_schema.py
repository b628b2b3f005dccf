"""docs/scenario.schema.json is the JSON Schema of the scenario format, kept up to date.

Regenerate it with ``SPLITROOM_WRITE_SCHEMA=1 .venv/bin/python -m pytest
tests/unit/test_scenario_schema.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from splitroom import scenario as sc
from splitroom.scenario import ScenarioIn

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "scenario.schema.json"


def current_schema() -> str:
    """The schema of :class:`ScenarioIn` as the committed file holds it."""
    s = ScenarioIn.model_json_schema(mode="validation")
    s = {"$schema": "https://json-schema.org/draft/2020-12/schema",
         "description": "splitroom scenario file (see docs/scenario.md). Quantities are strings "
                        "with units; defaults shown as numbers are in base units (B, s, B/s).",
         **s}
    return json.dumps(s, indent=2, sort_keys=True) + "\n"


def test_schema_file_is_up_to_date():
    text = current_schema()
    if os.environ.get("SPLITROOM_WRITE_SCHEMA"):
        SCHEMA.write_text(text)
    assert SCHEMA.read_text() == text, "run with SPLITROOM_WRITE_SCHEMA=1 to regenerate"


def test_docs_name_every_key():
    """docs/scenario.md names every key of every section (by its YAML spelling)."""
    doc = (SCHEMA.parent / "scenario.md").read_text()
    sections = (sc.ScenarioIn, sc.DeviceIn, sc.NetworkIn, sc.JitterIn, sc.EpisodesIn, sc.LinkIn,
                sc.WorkloadIn, sc.DecodingIn, sc.SpeculativeIn, sc.SamplingIn, sc.InlineModelIn, sc.StageIn,
                sc.EmulateIn, sc.OverheadIn, sc.OffloadIn)
    missing = [f"{cls.__name__}.{f.alias or k}" for cls in sections for k, f in cls.model_fields.items()
               if f"`{f.alias or k}`" not in doc]
    assert not missing, missing
