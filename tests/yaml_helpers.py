"""Beam YAML test scaffolding shared by the test modules: the provider, specs written, built, run.

A spec is a dict (dumped with ``yaml.safe_dump``) or YAML text (written as is). Runs use
beamsynth's ``LocalDirectRunner`` unless a test names another runner (Beam's ``DirectRunner``
first tries to download Prism, docs/runners.md).
"""

from __future__ import annotations

import json
from glob import glob
from importlib import resources
from pathlib import Path
from typing import Any

import apache_beam as beam
import yaml

from beamsynth.runners.local import LOCAL_DIRECT_RUNNER

__all__ = ["SHOP_SCHEMA", "build", "json_lines", "provider", "run_yaml", "write_schema",
           "write_yaml"]

Spec = dict | str

# A small schema with a privacy id, an integer binned column and a categorical one (several test
# modules: YAML steps, the API, audits)
SHOP_SCHEMA = {"name": "shop", "privacy_id": "customer", "columns": [
    {"name": "age", "type": "integer",
     "domain": {"kind": "integer", "low": 18, "high": 90, "edges": [18, 30, 45, 60, 91]}},
    {"name": "region", "type": "categorical",
     "domain": {"kind": "categorical", "values": ["north", "south", "east", "west"]}}]}


def provider() -> str:
    """The path of the provider file that ships with the package."""
    return str(resources.files("beamsynth.pipelines") / "beamsynth_provider.yaml")


def _text(spec: Spec, sort_keys: bool) -> str:
    return spec if isinstance(spec, str) else yaml.safe_dump(spec, sort_keys=sort_keys)


def write_yaml(path: Path, spec: Spec, *, sort_keys: bool = True) -> Path:
    """Write ``spec`` (a schema, a pipeline) to ``path`` as YAML; returns ``path``."""
    path.write_text(_text(spec, sort_keys), encoding="utf-8")
    return path


def write_schema(folder: Path, schema: Spec, name: str = "schema.yaml") -> Path:
    """A schema file in ``folder``: a dict as JSON for ``.json`` names, else as YAML."""
    path = folder / name
    if name.endswith(".json") and not isinstance(schema, str):
        path.write_text(json.dumps(schema), encoding="utf-8")
        return path
    return write_yaml(path, schema)


def build(spec: Spec, *, sort_keys: bool = True) -> beam.Pipeline:
    """The pipeline built from ``spec`` as ``apache_beam.yaml.main`` builds it (no run).

    The text form, as the main program reads it: Beam YAML's loader marks each step's line.
    """
    from apache_beam.yaml.yaml_transform import expand_pipeline

    p = beam.Pipeline()
    expand_pipeline(p, _text(spec, sort_keys))
    return p


def run_yaml(path: Path, spec: Spec | None = None, *args: str, runner: str = LOCAL_DIRECT_RUNNER,
             sort_keys: bool = True) -> None:
    """Run the pipeline file ``path`` with ``apache_beam.yaml.main`` (writing ``spec`` there
    first when given); ``args`` are more pipeline options."""
    from apache_beam.yaml import main as yaml_main

    if spec is not None:
        write_yaml(path, spec, sort_keys=sort_keys)
    yaml_main.run(argv=[f"--runner={runner}", f"--yaml_pipeline_file={path}", *args])


def json_lines(pattern: str) -> list[Any]:
    """Every JSON line of the files matching ``pattern`` (sorted by file name)."""
    return [json.loads(line) for f in sorted(glob(pattern))
            for line in Path(f).read_text(encoding="utf-8").splitlines()]
