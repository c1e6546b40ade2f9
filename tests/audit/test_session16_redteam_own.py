"""Sixteenth session red team (H83) of the session's own changes (0e35b3b..83681e9), with neighbour
pairs through the real paths (API ``job.private`` + mechanisms + ``bs.WriteManifest``, Beam YAML,
the CLI) and recorded draws. docs/audits.md "Sixteenth session: red team of the session's own
changes (H83)" has the numbers and what each test was checked against (a broken variant it
catches).

1. Found and fixed: two ``job.private`` steps of one job with one source name (two composites'
   ``"Private" >> job.private(schema)``, or one ``source=`` given twice) were one source to the
   manifest (listed twice, operational counts merged) and, seeded, shared the bounding seed
   (``step_seed("<label>/bound")``): the second is refused when built (renamed under
   ``--auto_unique_labels`` where the name is the label) and the bound's seed is the source's.
2. Clean: the option checks aa9c4cb removed from the methods (k, γ, ε₀, the candidate bounds, the
   target-parent mode, ...) are still refused by the API, Beam YAML and the CLI/release plan.
3. Clean: da1552d's one target-parent gate reads the DP count: D and D − 1 at the gate's edge,
   given the same n̂, decide alike.
4. Clean: 545c337/fe84720's weak registries: a job nobody keeps still owns its pipeline after
   ``gc.collect()`` (a second job, a YAML statistics step or ledger is refused).
"""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import beamsynth as bs
from tests.test_session15_manifest import SPEC, _records

pytestmark = pytest.mark.audit

ID_SPEC = {**SPEC, "name": "toy_ids", "privacy_id": "pid"}


class _Private(beam.PTransform):
    """A composite reading its own records into the job under the inner label ``Private``."""

    def __init__(self, job, records, schema, **kwargs) -> None:
        super().__init__()
        self._job, self._records, self._schema, self._kwargs = job, records, schema, kwargs

    def expand(self, pbegin):
        return (pbegin | "Create" >> beam.Create(self._records)
                | "Private" >> self._job.private(self._schema, **self._kwargs))


# -- 1. one source name per job.private ------------------------------------------------------------
def test_two_job_private_steps_with_one_source_name_are_refused():
    """Two composites each applying ``"Private" >> job.private(schema)`` built and were one source
    to the job: the manifest listed ``Private`` twice and merged its exact counts (read 350 for
    300 + 50), and seeded both bounds drew from ``step_seed("Private/bound")``. Now the second
    is refused when built; an explicit ``source=`` given twice likewise; distinct names build."""
    schema = bs.load_schema(SPEC)
    job = bs.PrivacyJob(epsilon=1.0, seed=3)
    p = beam.Pipeline()
    _ = p | "A" >> _Private(job, _records(30), schema)
    with pytest.raises(RuntimeError, match="'Private'.*already"):
        _ = p | "B" >> _Private(job, _records(5), schema)
    _ = p | "C" >> _Private(job, _records(5), schema, source="other")
    with pytest.raises(ValueError, match="'other'.*already"):
        _ = p | "D" >> _Private(job, _records(5), schema, source="other")
    assert [s["source"] for s in job.sources] == ["Private", "other"]


def test_auto_unique_labels_rename_a_second_source_from_its_label(tmp_path):
    """Under ``--auto_unique_labels`` the second label-named source is ``Private_2``: the manifest
    states each source's own counts (read 30 and 5, not 35 twice), and its bound draws apart."""
    schema = bs.load_schema(SPEC)
    job = bs.PrivacyJob(epsilon=1.0, seed=3)
    path = tmp_path / "manifest.json"
    with beam.Pipeline(options=PipelineOptions(["--auto_unique_labels"])) as p:
        a = p | "A" >> _Private(job, _records(30), schema)
        b = p | "B" >> _Private(job, _records(5, seed=2), schema)
        _ = a | "CountA" >> bs.Count(epsilon=0.5)
        _ = b | "CountB" >> bs.Count(epsilon=0.5)
        _ = p | bs.WriteManifest(job=job, path=str(path))
    manifest = json.loads(path.read_text())
    assert [s["source"] for s in job.sources] == ["Private", "Private_2"]
    sources = manifest["operational"]["sources"]
    assert {k: v["read"] for k, v in sources.items()} == {"Private": 30, "Private_2": 5}


def test_each_source_bounds_with_its_own_seed(monkeypatch):
    """Seeded, the bound's seed is the source's (``step_seed("<source>/bound")``): two composites'
    ``Private`` steps (renamed) or two explicit sources under one label draw apart."""
    from beamsynth.transforms import private as private_module
    seeds = []

    class Recording(private_module.BoundContributions):
        def __init__(self, **kwargs) -> None:
            seeds.append(kwargs["seed"])
            super().__init__(**kwargs)
    monkeypatch.setattr(private_module, "BoundContributions", Recording)
    schema = bs.load_schema(ID_SPEC)
    records = [dict(r, pid=str(i % 7)) for i, r in enumerate(_records(20))]
    job = bs.PrivacyJob(epsilon=1.0, seed=3, privacy_unit=bs.PrivacyUnit(
        id_column="pid", max_contributions=1))
    p = beam.Pipeline(options=PipelineOptions(["--auto_unique_labels"]))
    _ = p | "A" >> _Private(job, records, schema)
    _ = p | "B" >> _Private(job, records, schema)
    _ = p | "C" >> _Private(job, records, schema, source="c.csv")
    _ = p | "D" >> _Private(job, records, schema, source="d.csv")
    assert seeds == [job.step_seed(f"{s}/bound") for s in ("Private", "Private_2", "c.csv",
                                                           "d.csv")]
    assert len(set(seeds)) == 4


# -- 2. aa9c4cb: the options no longer re-checked by the methods are still refused everywhere ---
_UNCHECKED = [  # (method, option, a value the removed check refused): every one changes the plan
    ("privbayes", "target_parent", "bogus"), ("privbayes", "target_parent", ""),
    ("plausible", "k", 0), ("plausible", "k", 2.5), ("plausible", "k", True),
    ("plausible", "omega", 0), ("plausible", "plausible_t", 0), ("plausible", "plausible_t", 1.5),
    ("plausible", "max_plausible", 0), ("plausible", "max_plausible", 5),  # < k (50)
    ("plausible", "max_plausible", 60.5), ("plausible", "max_check_plausible", 0),
    ("plausible", "pd_max_parents", -1), ("plausible", "pd_max_cost", 0),
    ("plausible", "pd_max_records", 1), ("plausible", "gamma", 1), ("plausible", "gamma", 0.5),
    ("plausible", "gamma", float("inf")), ("plausible", "epsilon0", 0),
    ("plausible", "epsilon0", -1.0), ("plausible", "epsilon0", float("nan")),
    ("plausible", "pd_model_fraction", 1), ("plausible", "pd_model_fraction", 0),
    ("plausible", "input_rows", -1), ("plausible", "plausible_test", "none"),
    ("plausible", "generator", "exact"),
]


@pytest.mark.parametrize(("method", "option", "value"), _UNCHECKED)
def test_options_no_longer_rechecked_are_refused_by_every_front_end(method, option, value):
    """aa9c4cb removed PrivBayesMethod's and PlausibleMethod's own checks of these options (k, ε₀,
    γ, the candidate bounds, the target-parent mode, ...), leaving Method.__init__'s
    check_option_values. Each bad value is still refused, before anything is spent, by the API
    (bs.Synthesize, when applied: the method is built then), Beam YAML (BeamsynthSynthesize) and
    the CLI's plan (SynthesisConfig, the path of synthesize and every release table)."""
    from tests.test_session15_options import _api_refusal, _cli_refusal, _yaml_refusal
    options = {option: value, **({"k": 50} if option == "max_plausible" else {})}
    for refusal in (_api_refusal(method, options, bound=True), _yaml_refusal(method, options),
                    _cli_refusal(method, options)):
        assert "must be" in refusal, refusal  # the option in the caller's words


# -- 3. da1552d: the one target-parent gate reads the DP count, never the exact one ---------------
@pytest.mark.parametrize("side", ["closed", "open"])
def test_dp_count_gate_edge_neighbours_decide_by_the_dp_count_only(monkeypatch, side):
    """A DP-count plan (no public rows, target declared, "auto" = "useful"): the measuring step
    asks PrivBayesPlan.target_parent_at with its n̂. D (E records, E the gate's edge) and D − 1,
    with the size count's draw recorded and set so both get the same n̂ (one below / at the
    edge), decide alike: same mode and usefulness (a gate fed the exact count would flip between
    them on the open side), and the same structure steps' count."""
    import numpy as np

    from beamsynth.transforms import privbayes_measure
    from beamsynth.transforms.budget import PureDP
    from beamsynth.transforms.privbayes import plan_privbayes
    from tests.test_session16_plan import B_SHAPE, T, _bin7, _measure

    plan = plan_privbayes(B_SHAPE, PureDP(epsilon=3.0), sizing="auto", rows=None, target=T,
                          refine_pairs=0)
    assert plan.target_parent == "useful" and plan.sizing.count_budget is not None
    edge = min(r for r in range(50, 5_000) if plan.target_parent_gate(r)[0])
    rows_hat = edge if side == "open" else edge - 1
    real = privbayes_measure.discrete_laplace
    drawn = []

    def size_draw(rs, scale, size):  # the size count's draw (the first), set to give rows_hat
        if not drawn:
            drawn.append(real(rs, scale, size))
            return np.array([rows_hat - exact[0]])
        return real(rs, scale, size)
    monkeypatch.setattr(privbayes_measure, "discrete_laplace", size_draw)
    seen = []
    for n in (edge, edge - 1):  # D, D − 1
        exact, drawn[:] = [n], []
        out = _measure(plan, _bin7(n))
        seen.append((out.sizing["rows_hat"], out.sizing.get("target_parent"),
                     out.sizing.get("target_parent_usefulness")))
    assert seen[0] == seen[1], seen
    assert seen[0][0] == rows_hat and seen[0][1] == ("required" if side == "open" else "off")


# -- 4. 545c337 / fe84720: weak registries keep one budget per pipeline ---------------------------
@pytest.mark.parametrize("second", ["api", "yaml statistics", "yaml ledger"])
def test_an_unkept_job_still_owns_its_pipeline_after_gc(second):
    """``p | beam.Create(...) | bs.PrivacyJob(epsilon=1).private(schema)``, neither the job nor
    its private collection kept, then ``gc.collect()``: the job lives as long as the pipeline's
    graph (MakePrivate holds it), so a second PrivacyJob, a Beam YAML statistics step (its own
    job) or a YAML synthesis ledger (claim_pipeline_budget) on the same pipeline is still refused
    when built; two budgets never spend over the same records."""
    import gc

    from beamsynth.pipelines import yaml_stats
    from beamsynth.transforms.private import claim_pipeline_budget

    p = beam.Pipeline()

    def first() -> None:  # nothing of it kept by the caller
        _ = p | "Read1" >> beam.Create([{"age": 30}]) | bs.PrivacyJob(epsilon=1.0).private("adult")
    first()
    gc.collect()
    rows = p | "Read2" >> beam.Create([beam.Row(age=30)])
    with pytest.raises(ValueError, match="already has"):
        if second == "api":
            _ = rows | "Second" >> bs.PrivacyJob(epsilon=1.0).private("adult")
        elif second == "yaml statistics":
            _ = rows | "Second" >> yaml_stats.Count(schema="adult", epsilon=0.3)
        else:
            claim_pipeline_budget(p, "BeamsynthSynthesize 'Second'")


# -- 5. Beam YAML synthesis: the manifest states how its encoder read privacy ids ------------------
@pytest.mark.parametrize("mode", ["rounded", "exact"])
def test_yaml_synthesis_manifest_states_how_ids_were_read(tmp_path, mode):
    """BeamsynthSynthesize reads ids with the schema's ``privacy_ids`` (``rounded`` by default):
    2**53 and 2**53 + 1 (as ints or as text) were one person (1 row dropped by the bound of 1)
    while its manifest said nothing of the mode (the API and the CLI state theirs, f2a4ef1). It
    now states ``ids`` as its encoder read them: ``rounded`` with 1 dropped, ``exact`` with 0."""
    from beamsynth.pipelines.yaml_transforms import Synthesize
    from tests.pipeline.test_beam_yaml import TINY

    schema = tmp_path / "tiny.yaml"
    schema.write_text(TINY.format(extra="ignore") + f"privacy_ids: {mode}\n", encoding="utf-8")
    manifest = tmp_path / "m.json"
    big = 2**53
    with beam.Pipeline() as p:
        _ = (p | beam.Create([beam.Row(color="red", age="30", pid=i) for i in (big, big + 1)])
             | Synthesize(schema=str(schema), epsilon=1.0, rows=4, seed=2, privacy_id="pid",
                          manifest=str(manifest)))
    m = json.loads(manifest.read_text())
    assert m["release"]["privacy_unit"].get("ids") == mode, m["release"]["privacy_unit"]
    assert m["operational"]["rows_dropped_by_bound"] == (1 if mode == "rounded" else 0)


# -- 6. 06739a5: a with_input_types mismatch warns, whatever beam.Create inferred from records ---
@pytest.mark.parametrize("elements", [[{"age": 30}], [{"age": 30}, 1, "x"], [1, 2], [None]],
                         ids=["dicts", "mixed", "ints", "none"])
def test_a_declared_hint_never_refuses_whatever_the_records(elements):
    """beam.Create types its output from the records (dicts, a Union, int, None), so a refusal on
    a hint mismatch would let one record decide whether the pipeline builds (rule 7). Every hint
    builds; by hand 10 element kinds x 12 hints (dict, Dict[str, Any], int, a NamedTuple,
    beam.Row, Any, Union, List, pa.Table, Optional[dict], Iterable, Tuple): 120 builds, 0
    refusals."""
    import typing

    for hint in (dict, typing.Dict[str, typing.Any], int, typing.Union[int, str],  # noqa: UP006, UP007
                 typing.Optional[dict]):  # noqa: UP045
        p = beam.Pipeline()
        _ = (p | beam.Create(elements)
             | bs.PrivacyJob(epsilon=1.0).private("adult").with_input_types(hint))
