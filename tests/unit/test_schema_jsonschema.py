"""The documented JSON Schema (schemas/schema.json) accepts every bundled example schema."""

import json
from pathlib import Path

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed")

ROOT = Path(__file__).resolve().parents[2] / "schemas"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_bundled_schema_matches_json_schema(path):
    spec = json.loads((ROOT / "schema.json").read_text())
    doc = yaml.safe_load(path.read_text())
    jsonschema.validate(json.loads(json.dumps(doc, default=str)), spec)


def test_json_schema_rejects_a_column_without_domain():
    spec = json.loads((ROOT / "schema.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"columns": [{"name": "a", "type": "categorical"}]}, spec)
