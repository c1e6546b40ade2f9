"""``beamsynth release CONFIG.yaml``, ``beamsynth ledger show|reconcile LEDGER`` and ``beamsynth report``."""

from __future__ import annotations

import argparse
import json
import sys

from beamsynth.pipelines.methods.progress import Progress
from beamsynth.pipelines.releases.config import RELEASE_CONFIG_SCHEMA, load_release_config
from beamsynth.pipelines.releases.ledger import (
    LedgerError,
    PrivacyLedger,
    format_budget,
    format_ledger,
)
from beamsynth.pipelines.releases.release import run_release

__all__ = ["add_parser"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``release`` and ``ledger`` subcommands."""
    p = sub.add_parser(
        "release", help="run a declarative release (config file) against a privacy ledger",
        description="Validate CONFIG (before reading any data), reserve its budget in the privacy "
                    "ledger, synthesize every table, write outputs, manifests and reports into the "
                    "release folder atomically and commit the spend. Extra --options go to Beam.")
    p.add_argument("config", nargs="?", help="release config (YAML)")
    p.add_argument("--date", default=None,
                   help="the night being released, YYYY-MM-DD (fills {date} in folder; default "
                        "today, UTC)")
    p.add_argument("--check", action="store_true",
                   help="validate the config and plan the spends, then stop (reads no data)")
    p.add_argument("--print-json-schema", action="store_true",
                   help="print the JSON Schema of release configs and exit")
    p.set_defaults(func=_run_release)

    lp = sub.add_parser("ledger", help="inspect or reconcile a privacy ledger",
                        description="show: print sources, policies, releases and spends. "
                                    "reconcile: decide stale pending reservations now.")
    lp.add_argument("action", choices=["show", "reconcile"])
    lp.add_argument("ledger", help="the SQLite ledger file")
    lp.add_argument("--json", action="store_true", help="print JSON instead of text (show)")
    lp.add_argument("--force", action="store_true",
                    help="reconcile: also abort unpublished reservations of processes that may be "
                         "alive on other hosts (only when no release is running)")
    lp.set_defaults(func=_run_ledger)

    rp = sub.add_parser(
        "report", help="HTML quality report for a real/synthetic pair (private statistics)",
        description="Compare a real and a synthetic table over the schema's declared cells: "
                    "distributions, associations, TVD per marginal, train-on-synthetic/test-on-real. "
                    "The report contains private statistics of the real data: owner only.")
    rp.add_argument("--real", required=True, help="real table (.csv, .jsonl, .avro, .parquet)")
    rp.add_argument("--synthetic", required=True, help="synthetic table")
    rp.add_argument("--schema", required=True, help="schema file or bundled name (adult)")
    rp.add_argument("--output", required=True, help="HTML file to write")
    rp.add_argument("--target", default=None, help="binary column for train-on-synthetic/test-on-real")
    rp.add_argument("--max-rows", type=int, default=200_000, help="rows read per table (default 200000)")
    rp.set_defaults(func=_run_report)


def _run_release(args: argparse.Namespace, beam_args: list[str]) -> int:
    if args.print_json_schema:
        print(json.dumps(RELEASE_CONFIG_SCHEMA, indent=2, ensure_ascii=False))
        return 0
    if not args.config:
        raise ValueError("release needs a CONFIG file")
    progress = Progress(quiet=getattr(args, "quiet", False))
    cfg = load_release_config(args.config, date=args.date)
    if args.check:
        return _check_release(cfg)
    from beamsynth.pipelines.cli.synthesize import pipeline_options

    release = run_release(cfg, pipeline_options(beam_args), progress=progress)
    _warn_rejected(cfg.folder, release["tables"])
    if not progress.quiet:
        print(f"released {release['name']} (ε={release['spent']['epsilon']:g}) → {cfg.folder}",
              file=sys.stderr)
    return 0


def _warn_rejected(folder: str, tables: list[str]) -> None:
    """The synthesize command's warning, per published table, when more than 5% of the rows read
    went to dead letters (private console only; the release is published either way: rule 7)."""
    from beamsynth.pipelines.cli.console import rejection_report
    from beamsynth.pipelines.io import filesystem as fs

    for name in tables:
        manifest = fs.join(folder, "private", f"{name}.manifest.json")
        if not fs.exists(manifest):
            continue
        op = json.loads(fs.read_text(manifest)).get("operational") or {}
        warning = rejection_report(op, fs.join(folder, "private", f"{name}.rejected.jsonl"),
                                   limit="the release's warning threshold")
        if warning:
            print(f"beamsynth release: table {name}: {warning}", file=sys.stderr)


def _check_release(cfg) -> int:
    """Plan the spends and ask the ledger whether it would take them now (reserving nothing).

    A night already published or running, a privacy-unit clash or an overspend raises
    :class:`~beamsynth.pipelines.releases.ledger.LedgerError` (the CLI prints it and exits 2).
    """
    import os
    import tempfile

    from beamsynth.pipelines.releases.release import plan_release, run_key

    plan = plan_release(cfg)
    for s in plan.spends:
        print(f"{s.source} [{s.privacy_unit}] {s.step}: ε={format_budget(s.epsilon)} "
              f"δ={format_budget(s.delta)} ({s.mechanism})")
    with tempfile.TemporaryDirectory() as empty:  # a missing ledger is created by the first
        # release, which checks the spends against the policies: ask an empty ledger the same
        path = cfg.ledger_path if os.path.exists(cfg.ledger_path) else os.path.join(empty, "l.sqlite")
        try:
            PrivacyLedger(path).check(run_key=run_key(cfg), spends=plan.spends, policies=cfg.policies)
        except LedgerError as exc:
            raise LedgerError(f"--check: {cfg.name} → {cfg.folder} cannot run: {exc}") from None
    print(f"ok: {cfg.name} → {cfg.folder} (not published yet; the ledger has room)")
    return 0


def _run_ledger(args: argparse.Namespace, beam_args: list[str]) -> int:
    import os

    from beamsynth.pipelines.io.filesystem import require_local

    require_local(args.ledger, "ledger")  # a SQLite file: gs://... is refused (exit 2)
    if not os.path.exists(args.ledger):
        raise FileNotFoundError(f"no ledger at {args.ledger!r}")
    ledger = PrivacyLedger(args.ledger)
    if args.action == "reconcile":
        decided = ledger.reconcile(force=args.force)
        for rid, state in decided:
            print(f"{rid}: {state}")
        if not decided:
            print("nothing to decide: no pending reservation of an ended run"
                  + ("" if args.force else " (a running one keeps counting; --force only when none "
                                           "is running)"))
        return 0
    if args.json:
        print(json.dumps({"sources": ledger.summary(), "releases": ledger.releases()}, indent=2,
                         ensure_ascii=False))
    else:
        print(format_ledger(ledger))
    return 0


def _run_report(args: argparse.Namespace, beam_args: list[str]) -> int:
    from beamsynth.pipelines.releases.report import build_report
    from beamsynth.schemas.schema import load_schema

    if beam_args:
        raise ValueError(f"report takes no pipeline options, got {beam_args}")
    out = build_report(real=args.real, synthetic=args.synthetic, schema=load_schema(args.schema),
                       output=args.output, target=args.target, max_rows=args.max_rows)
    if not getattr(args, "quiet", False):
        print(f"wrote {out} (contains private statistics: owner only)", file=sys.stderr)
    return 0
