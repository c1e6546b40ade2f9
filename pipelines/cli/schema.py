"""``beamsynth schema validate|show|avro SCHEMA`` and ``beamsynth schema draft DICTIONARY``."""

from __future__ import annotations

import argparse
import json
import sys

from beamsynth.pipelines.io.filesystem import write_text_atomic
from beamsynth.pipelines.io.preflight import check_outputs
from beamsynth.pipelines.schema_draft import DRAFT_FORMATS, draft_schema
from beamsynth.schemas.schema import load_schema

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``schema`` subcommand."""
    p = sub.add_parser("schema", help="validate, show or draft a schema file")
    p.add_argument("action", choices=["validate", "show", "avro", "draft"],
                   help="validate: check the file; show: print it normalized; avro: print its "
                        "Avro schema; draft: draft a schema from a public data dictionary "
                        "(never from the data) for review")
    p.add_argument("schema", help="schema file (.yaml/.json) or bundled name (adult); for draft: "
                                  "the data dictionary or codebook file")
    p.add_argument("--format", default="auto", choices=[*DRAFT_FORMATS, "json"],
                   help="draft: dictionary form (sdnist data_dictionary.json, domain-json like "
                        "adult-domain.json, csv codebook, smartnoise metadata YAML; json = either "
                        "JSON form; default: from the file)")
    p.add_argument("--with", dest="also", action="append", default=[], metavar="DICTIONARY",
                   help="draft: another public dictionary (repeatable, any form, read by its "
                        "extension and shape) filling in what the first leaves undeclared, e.g. "
                        "the categories of SmartNoise string columns; where both declare a "
                        "domain the first dictionary wins and a '# REVIEW:' note names the other")
    p.add_argument("--table", help="draft: the table of a SmartNoise collection (name or "
                                   "schema.table) when it holds several")
    p.add_argument("--header-from", metavar="DATA_FILE",
                   help="draft: order the columns as this data file's header line (CSV first "
                        "line, Avro/Parquet schema); only the column names are read, no record")
    p.add_argument("--output", help="draft: schema YAML to write (default: standard output)")
    p.add_argument("--name", help="draft: schema name (default: the dictionary's file name)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace, beam_args: list[str]) -> int:
    if beam_args:  # e.g. the --runner a script passes to every command
        raise ValueError(f"`schema {args.action}` runs no pipeline, so it takes no pipeline "
                         f"options (got {' '.join(beam_args)}): drop them")
    if args.action != "draft" and (args.output or args.name or args.format != "auto" or args.also
                                   or args.table or args.header_from):
        raise ValueError("--format, --output, --name, --with, --table and --header-from apply to "
                         "`schema draft` only")
    if args.action == "draft":
        return _draft(args)
    schema = load_schema(args.schema)
    if args.action == "validate":
        sizes = ", ".join(f"{c.name}={c.cells}" + (f" ({c.domain.size} + null)" if c.nullable else "")
                          for c in schema.columns)  # cells as the mechanisms count them
        print(f"schema {schema.name!r} is valid: {len(schema.columns)} columns, cells ({sizes}); "
              f"privacy id: {schema.privacy_id or 'none (one record = one unit)'}")
    elif args.action == "show":
        print(json.dumps(schema.to_spec(), indent=2, ensure_ascii=False))
    else:
        print(json.dumps(schema.avro_schema(), indent=2))
    return 0


def _draft(args: argparse.Namespace) -> int:
    if args.output:
        check_outputs([args.output])
    fmt = "json" if args.format == "json" else args.format
    text = draft_schema(args.schema, fmt=fmt if fmt != "json" else "auto", name=args.name,
                        table=args.table, also=args.also, header_from=args.header_from)
    load_schema(_parsed(text))  # the draft must validate before anyone reviews it
    reviews = text.count("# REVIEW:")
    if args.output:
        write_text_atomic(args.output, text)  # Beam FileSystems: a local path, gs://, ...
        print(f"drafted {args.output} from {args.schema}: {reviews} line(s) marked '# REVIEW:' "
              "to check before use", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _parsed(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)
