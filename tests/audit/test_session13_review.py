"""Session 13 privacy review (H52) of this session's commits (5cc3cae..), through the real entry
points (Beam YAML via ``apache_beam.yaml.main``, ``bs.*`` on the DirectRunner).

1. Beam YAML statistics steps (H46: fc0a210, 9898628, cef1afd, f686454) next to
   ``BeamsynthSynthesize`` under one ``job_budget``, found clean and kept as an audit: every
   discrete Laplace draw of a pipeline with all five steps (Count, Histogram, Marginals,
   Prefixes, Synthesize; privacy id, max_contributions 2) is recorded from the draw itself;
   Σ m/b over the draws (a prefix tree's per-level "final" draws count once: they measure the
   disjoint leaves of one second pass, seed 003 §2.3) is the job's 1.0 exactly (0.1 + 0.2 + 0.2 +
   0.2 + 0.3), and no two draws share a randomness stream (seeded: a seed per step; secure: one
   run secret per transform).
2. Windowings of one job (rule 3): the YAML ledger refused steps of different privacy units but
   not of different windowings; ``BeamsynthCount`` per 600-s window (ε 0.5) and
   ``BeamsynthSynthesize`` per 3600-s window (ε 0.5) built under ``job_budget {epsilon: 1.0}``,
   each manifest stating the ledger's 1.0 per declared window. One person's six records, one per
   10-minute slot of one hour (max_contributions 1, bounded per window), are in six Count
   releases and one synthesis: 6 · 0.5 + 0.5 = 3.5 for that person's records in one 3600-s
   window. The API refuses this (``PrivacyJob.use_windows``: one windowing per job); the ledger
   now does too.
3. Typed rows lacking a required field (H50's 77a7d72): ``job.private`` refused them when built,
   and ``beam.io.ReadFromJson`` types its rows from the records, so D (50 records without
   ``income``) was refused while D + one record carrying ``income`` built and released (rule 7).
   The lead's d6bc27b made it a warning; the API and YAML-statistics pairs are kept here.
4. An API ``bs.PrivacyJob`` and the YAML ``BeamsynthSynthesize`` step class in one Python
   pipeline each spent a full budget on the same records (ε 1 + 1, each manifest saying 1): the
   API's one-job check (``_PIPELINE_JOBS``) and the YAML ledger (``_LEDGERS``) did not see each
   other. Now the ledger claims the pipeline (``private.claim_pipeline_budget``) and either order
   is refused when built; the YAML statistics steps' own job stays allowed beside the ledger.
5. H47's zCDP refinement cut (798ad58), found clean: chosen per declared window from that
   window's DP count, the plan never cut, every window's draws within the zCDP spend.
6. The network→forest band (H49 b43da64, H53 e955c63) from the DP count, found clean: the band's
   forest or target star under Laplace and zCDP plans draws pure ε − ε_c exactly.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import apache_beam as beam
import pytest

from tests.pipeline.test_yaml_stats import TINY  # color (nullable, 3 values), age (2 bins)
from tests.yaml_helpers import provider, run_yaml

pytestmark = pytest.mark.audit


def _record_laplace(monkeypatch) -> list[dict]:
    """Every discrete Laplace draw a beamsynth module makes: its scale, size, labels and stream
    (seed, or the run secret's key) — read from the draw, not from the accountant."""
    import beamsynth.pipelines.yaml_stats  # noqa: F401  (every drawing module imported first)
    import beamsynth.pipelines.yaml_transforms  # noqa: F401
    import beamsynth.transforms.noise as noise
    import beamsynth.transforms.prefix  # noqa: F401

    calls: list[dict] = []
    orig = noise.discrete_laplace

    def rec(rs, param, size):
        stream = ("seed", rs.seed) if rs.seeded else ("secret", rs.run_secret.stream_key(()).hex())
        calls.append({"scale": float(param), "labels": tuple(rs.labels), "stream": stream})
        return orig(rs, param, size)

    for name, mod in list(sys.modules.items()):
        if name.startswith("beamsynth.") and mod is not noise and mod is not None:
            for attr, value in list(vars(mod).items()):
                if value is orig:
                    monkeypatch.setattr(mod, attr, rec)
    return calls


def _five_steps(tmp_path: Path, seed: int | None, m: int) -> dict:
    schema = tmp_path / "tiny.yaml"
    schema.write_text(TINY, encoding="utf-8")
    data = tmp_path / "in.csv"
    data.write_text("pid,color,age,word\n" + "".join(
        f"p{i % 7},{['red', 'green', 'blue'][i % 3]},{(i * 13) % 100},{['ab', 'b', 'abc', 'ba'][i % 4]}\n"
        for i in range(40)), encoding="utf-8")

    def cfg(eps: float, **kw) -> dict:
        return {"schema": str(schema), "epsilon": eps, "job_budget": {"epsilon": 1.0},
                "privacy_id": "pid", "max_contributions": m,
                **({} if seed is None else {"seed": seed}), **kw}

    key = {"kind": "text", "column": "word", "alphabet": "abc", "max_length": 3}
    steps = [
        {"type": "BeamsynthCount", "name": "C", "input": "Read", "config": cfg(0.1)},
        {"type": "BeamsynthHistogram", "name": "H", "input": "Read",
         "config": cfg(0.2, columns=["color", "age"])},
        {"type": "BeamsynthMarginals", "name": "M", "input": "Read",
         "config": cfg(0.2, marginals=[["color", "age"], ["age"]])},
        {"type": "BeamsynthPrefixes", "name": "P", "input": "Read",
         "config": cfg(0.2, method="basic", key=key)},
        {"type": "BeamsynthSynthesize", "name": "S", "input": "Read", "config": cfg(0.3, rows=5)},
    ]
    out = tmp_path / "out"
    writes = [{"type": "WriteToJson", "name": f"W{i}", "input": src, "config": {"path": f"{out}/{i}"}}
              for i, src in enumerate(["C", "H", "M.age", "M.color_by_age", "P.keys", "S"])]
    return {"providers": [{"include": provider()}], "pipeline": {"transforms": [
        {"type": "ReadFromCsv", "name": "Read",
         "config": {"path": str(data), "keep_default_na": False, "dtype": "str"}},
        *steps, *writes]}}


# -- 1. five steps, one job budget: what the draws use ---------------------------------------------
@pytest.mark.parametrize("seed", [3, None], ids=["seeded", "secure"])
def test_five_yaml_steps_draw_exactly_the_job_budget(monkeypatch, tmp_path: Path, seed) -> None:
    """Measured (m = 2): Count 1 draw b = 20 (0.1), Histogram 2 tables b = 20 (0.1 each),
    Marginals 2 tables b = 20, Prefixes basic 4 levels b = 53.3 (0.0375 each) + final b = 40
    (0.05, once), Synthesize 3 one-way tables b = 20: Σ = 1.0000; 16 draws, 5 streams, no stream
    drawn twice."""
    pytest.importorskip("apache_beam.yaml.main", reason="Beam YAML extras")

    m = 2
    calls = _record_laplace(monkeypatch)
    run_yaml(tmp_path / "p.yaml", _five_steps(tmp_path, seed, m))
    finals = [c for c in calls if c["labels"][-1] == "final"]
    others = [c for c in calls if c["labels"][-1] != "final"]
    assert finals and len({c["scale"] for c in finals}) == 1  # one second pass over disjoint leaves
    used = sum(m / c["scale"] for c in others) + m / finals[0]["scale"]
    assert used <= 1.0 * (1 + 1e-9), used
    assert used == pytest.approx(1.0)  # the whole job budget, nothing unaccounted
    streams = collections.Counter((c["stream"], c["labels"]) for c in calls)
    assert max(streams.values()) == 1, streams  # no draw reused
    assert len({c["stream"] for c in calls}) == 5  # one seed / run secret per step


# -- 2. one windowing per job ------------------------------------------------------------------------
def test_steps_of_one_job_with_different_windowings_are_refused(tmp_path: Path) -> None:
    """Count per 600-s window + Synthesize per 3600-s window under one job_budget: a person's
    records in one hour reach six Count releases and one synthesis (3.5 · ε-share, module
    docstring). Refused when built, as bs.PrivacyJob refuses it; equal windows still build."""
    from beamsynth.pipelines import yaml_stats
    from beamsynth.pipelines.yaml_transforms import Synthesize

    schema = tmp_path / "tiny.yaml"
    schema.write_text(TINY, encoding="utf-8")
    job = {"epsilon": 1.0}
    hour = {"start": 0, "end": 3600, "size": 3600}
    for first, second in [({"start": 0, "end": 3600, "size": 600}, hour), (hour, None), (None, hour)]:
        p = beam.Pipeline()
        rows = (p | beam.Create([(beam.Row(color="red", age="3", pid="a"), 10)])
                | beam.MapTuple(lambda r, t: beam.window.TimestampedValue(r, t)))
        _ = rows | "C" >> yaml_stats.Count(schema=str(schema), epsilon=0.5, job_budget=job,
                                           windows=first, privacy_id="pid")
        with pytest.raises(ValueError, match=r"'S': windows .* differ from the other steps'"):
            _ = rows | "S" >> Synthesize(schema=str(schema), epsilon=0.5, rows=5, job_budget=job,
                                         windows=second, privacy_id="pid")
    p = beam.Pipeline()
    rows = (p | beam.Create([(beam.Row(color="red", age="3", pid="a"), 10)])
            | beam.MapTuple(lambda r, t: beam.window.TimestampedValue(r, t)))
    _ = rows | "C" >> yaml_stats.Count(schema=str(schema), epsilon=0.5, job_budget=job,
                                       windows=dict(hour), privacy_id="pid")
    _ = rows | "S" >> Synthesize(schema=str(schema), epsilon=0.5, rows=5, job_budget=job,
                                 windows=dict(hour), privacy_id="pid")  # the same windows: fine


# -- 3. typed rows lacking a required field (77a7d72, warned since d6bc27b) ------------------------
def _json_builds(records: list[dict], path: Path, step: str) -> bool:
    """Whether ``beam.io.ReadFromJson(path)`` → ``job.private`` + ``bs.Count`` (``step="api"``) or
    → the Beam YAML ``BeamsynthCount`` step builds (Beam types the rows from the records)."""
    import beamsynth as bs
    from beamsynth.pipelines import yaml_stats

    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    p = beam.Pipeline()
    rows = p | beam.io.ReadFromJson(str(path), lines=True)
    try:
        if step == "api":
            small = bs.load_schema("adult").select(["age", "sex", "race", "income"])
            _ = rows | bs.PrivacyJob(epsilon=1.0, seed=1).private(small) | bs.Count(epsilon=1.0)
        else:
            schema = path.with_suffix(".yaml")
            schema.write_text(TINY, encoding="utf-8")
            _ = rows | "Count" >> yaml_stats.Count(schema=str(schema), epsilon=1.0, seed=1)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("step", ["api", "yaml"])
def test_lacking_field_check_does_not_depend_on_one_record(tmp_path: Path, step: str) -> None:
    """Neighbours through beam.io.ReadFromJson, D without a required field and D + one record
    carrying it: API, D = 50 {age, sex, race} vs D + {..., income}: at 77a7d72 D was refused
    ("lack 'income'") and D + record built and released (Count noisy_count 1, seed 1); YAML
    BeamsynthCount, D = 50 {color} vs D + {color, age}. Both must build (rule 7)."""
    if step == "api":
        base = [{"age": 30 + i % 40, "sex": "Male", "race": "White"} for i in range(50)]
        extra = {"age": 40, "sex": "Female", "race": "White", "income": "<=50K"}
    else:
        base = [{"color": "red"} for _ in range(50)]
        extra = {"color": "blue", "age": 7}
    assert _json_builds(base, tmp_path / "d.jsonl", step)
    assert _json_builds(base + [extra], tmp_path / "d1.jsonl", step)


# -- 4. an API PrivacyJob next to a YAML BeamsynthSynthesize step (refused when built) --------------
@pytest.mark.parametrize("api_first", [True, False], ids=["api-first", "yaml-first"])
def test_api_job_and_yaml_synthesis_step_in_one_pipeline_are_refused(tmp_path: Path,
                                                                     api_first: bool) -> None:
    """Measured: a Python pipeline with bs.PrivacyJob(epsilon=1) | bs.Count(epsilon=1) and the
    YAML step class yaml_transforms.Synthesize(epsilon=1, rows=5) over the same rows builds in
    either order (2.0 on every record; the API manifest says 1.0 and the step's manifest 1.0).
    The statistics steps are refused in this position (their PrivacyJob meets the API's check)."""
    import beamsynth as bs
    from beamsynth.pipelines.yaml_transforms import Synthesize

    schema = tmp_path / "tiny.yaml"
    schema.write_text(TINY, encoding="utf-8")
    p = beam.Pipeline()
    rows = p | beam.Create([beam.Row(color="red", age="3")] * 20)
    job = bs.PrivacyJob(epsilon=1.0, seed=1)

    def api():
        _ = rows | "API" >> job.private(str(schema)) | bs.Count(epsilon=1.0)

    def yaml_step():
        _ = rows | "S" >> Synthesize(schema=str(schema), epsilon=1.0, rows=5, seed=1)

    first, second = (api, yaml_step) if api_first else (yaml_step, api)
    first()
    with pytest.raises(ValueError, match="(keeps its own job budget|already has a bs.PrivacyJob)"):
        second()


# -- 5. H47's zCDP refinement cut from the DP count, per declared window (798ad58) -------------------
def test_refinement_cut_is_chosen_per_window_and_fits_rho(monkeypatch) -> None:
    """One PrivBayesMeasureFn over three declared windows of 14,000, 40,000 and 14,000 records
    (zCDP plan, Adult's shape, ε = 1, δ = 1e-9, DP count): each window draws its own size count,
    chooses its refinement from its own n̂ (measured: 28, 40, 28 pairs; 8,000 until H53's band
    took it; the cut of the first
    window does not stick to the plan) and its draws cost ρ/ρ' = 1.000000 of the zCDP spend
    (the dropped pairs' ρ on the network tables, never more), by the recorded draws."""
    from apache_beam.transforms.window import IntervalWindow

    from beamsynth.transforms.measure import window_labels
    from beamsynth.transforms.privbayes_measure import PrivBayesMeasureFn
    from tests.audit import test_session12_accounting as s12

    plan, spends, _ = s12._plan_and_spends(1, None)
    planned = plan.refine.pairs
    calls = s12.record_draws(monkeypatch)
    fams, _ = s12._counts(plan, s12._codes(1, 0))
    fn = PrivBayesMeasureFn(families=fams, shape=s12.SHAPE,
                            names=[f"c{i}" for i in range(len(s12.SHAPE))], plan=plan, seed=5)
    pairs = []
    for i, n in enumerate((14_000, 40_000, 14_000)):
        window = IntervalWindow(i * 3600, (i + 1) * 3600)
        _, counts = s12._counts(plan, s12._codes(n, i))
        (out,) = list(fn.process(counts, window=window))
        assert out.sizing["degree"] > 0, out.sizing  # the network branch in every window
        pairs.append(out.sizing["refine_pairs"])
        mine = [c for c in calls if c["labels"][1:1 + len(window_labels(window))]
                == window_labels(window)]
        v = s12.verdict(mine, m=1, count=spends["privbayes.size_count"],
                        rest=spends["privbayes.zcdp"])
        assert v["ok"], (n, v)
    assert pairs[0] < planned and pairs[1] == planned and pairs[2] == pairs[0], pairs
    assert plan.refine.pairs == planned  # the plan itself is never cut


# -- 6. H49/H53's network -> forest band from the DP count (b43da64, e955c63) -----------------------
@pytest.mark.parametrize("target", [False, True], ids=["forest", "star"])
@pytest.mark.parametrize("noise_mode", ["laplace", "gaussian"])
def test_band_model_from_the_dp_count_fits_its_spends(monkeypatch, noise_mode, target) -> None:
    """9,000 records of Adult's shape, ε = 1 (δ = 1e-9 for the zCDP plan), DP count: inside the
    band the run fits the forest (or, with a declared target, the star) instead of the k = 1
    network; its recorded draws are pure and sum to ε − ε_c = 0.98 exactly (the size count
    within its own spend). Sweep (not kept): n 2,000-30,000, m 1/2, Laplace and zCDP, with and
    without target, DP count and public rows: every draw set within its spends."""
    from tests.audit import test_session12_accounting as s12
    from tests.audit import test_session13_redteam as rt

    if target:
        plan, spends, acc = rt._star_plan(noise_mode, 1, None)
    else:
        budget = s12.ApproxDP(epsilon=s12.EPS, delta=s12.DELTA if noise_mode == "gaussian" else 0.0)
        plan = s12.plan_privbayes(s12.SHAPE, budget, sizing="auto", max_contributions=1)
        if noise_mode == "gaussian":
            plan = s12.gaussian_plan(plan, budget)
        acc = s12.PrivacyAccountant(total=budget)
        s12.spend_privbayes(acc, plan)
        spends = {s["step"]: s for s in acc.to_dict()["spends"]}
    calls = s12.record_draws(monkeypatch)
    out, _ = rt._measure(plan, s12._codes(9_000, 0))
    assert out.sizing["degree"] == 0, out.sizing  # the band: no network at this n̂
    count = spends["privbayes.size_count"]
    rest = spends.get("privbayes.zcdp") or {"epsilon": acc.spent_epsilon - count["epsilon"],
                                            "delta": acc.spent_delta}
    v = s12.verdict(calls, m=1, count=count, rest=rest)
    assert v["ok"] and v["gaussian"] == 0, v
    assert v["pure"] == pytest.approx(s12.EPS - count["epsilon"], rel=1e-9)
