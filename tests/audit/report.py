"""Print the audit table (Markdown): every registered mechanism and broken variant, every pair.

    python -m tests.audit.report            # slow_runs on the tightest pair, a tenth on the others
    python -m tests.audit.report --fast     # the default-suite run counts

Seeded (seed 2026), so the table is reproducible; run it under ``nice`` (minutes of CPU).
"""

from __future__ import annotations

import argparse
import time

from beamsynth.transforms.audit import AUDIT_ALPHA, audit_pair
from beamsynth.transforms.noise import RandomSource
from tests.audit.cases import AUDITS, BROKEN


def main(argv: list[str] | None = None) -> int:
    """Run the audits and print one Markdown row per (mechanism, pair)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true", help="use the default-suite run counts")
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    print(f"confidence 1 - {AUDIT_ALPHA:g} per row (Clopper–Pearson, Bonferroni over events)\n")
    print("| mechanism | neighbouring pair | claimed ε (δ) | audited ε lower bound | runs per side | verdict | seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for registry in (AUDITS, BROKEN):
        for name, case in registry.items():
            if only and name not in only:
                continue
            pairs = case.pairs if registry is AUDITS else case.pairs[:1]
            for i, pair in enumerate(pairs):
                runs = case.runs if args.fast else case.slow_runs
                if registry is BROKEN:
                    runs = case.runs
                elif i:
                    runs = max(200, runs // 10)
                t = time.time()
                r = audit_pair(case, pair, runs=runs, rs=RandomSource(seed=2026).child(name, i))
                verdict = ("caught" if not r.passed else "MISSED") if case.broken else \
                    ("ok" if r.passed else "EXCEEDS CLAIM")
                claim = f"{case.epsilon:.3g}" + (f" ({case.delta:.2g})" if case.delta else "")
                print(f"| {name} | {pair.name} | {claim} | {r.epsilon_lower_bound:.3f} | {runs} | "
                      f"{verdict} | {time.time() - t:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
