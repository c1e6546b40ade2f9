"""``beamsynth schema validate SCHEMA`` and ``beamsynth schema show SCHEMA``."""

from __future__ import annotations

import argparse
import json

from beamsynth.schemas.schema import load_schema

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``schema`` subcommand."""
    p = sub.add_parser("schema", help="validate or show a schema file")
    p.add_argument("action", choices=["validate", "show", "avro"],
                   help="validate: check the file; show: print it normalized; avro: print its Avro schema")
    p.add_argument("schema", help="schema file (.yaml/.json) or bundled name (adult)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    if beam_args:
        raise ValueError(f"unexpected arguments: {' '.join(beam_args)}")
    schema = load_schema(args.schema)
    if args.action == "validate":
        sizes = ", ".join(f"{c.name}={c.domain.size}" for c in schema.columns)
        print(f"schema {schema.name!r} is valid: {len(schema.columns)} columns ({sizes}); "
              f"privacy id: {schema.privacy_id or 'none (one record = one unit)'}")
    elif args.action == "show":
        print(json.dumps(schema.to_spec(), indent=2, ensure_ascii=False))
    else:
        print(json.dumps(schema.avro_schema(), indent=2))
    return 0
