"""Pipeline tests of the plausible-deniability stage (TestPipeline + assert_that)."""

from __future__ import annotations

import json
from collections import Counter

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that

from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms.budget import PureDP
from beamsynth.transforms.noise import RandomSource
from beamsynth.transforms.plausible import (
    DPPlausibleBayesNet,
    GenerateCandidates,
    PlausibleDeniabilityFilter,
    SplitForPlausible,
)

OPTIONS = PipelineOptions(["--runner=DirectRunner", "--direct_num_workers=1"])
SHAPE = (3, 2, 4, 3)


def _data(n=3000, seed=0):
    rs = RandomSource(seed=seed)
    codes = np.stack([rs.child(i).integers(s, n) for i, s in enumerate(SHAPE)], 1)
    codes[:, 1] = (codes[:, 0] + (rs.child("x").uniform(n) < 0.1)) % 2
    return codes


def _batches(codes, size=700):
    return [EncodedBatch(codes[i:i + size]) for i in range(0, len(codes), size)]


def _rows(batches):
    return sorted(tuple(r) for b in batches for r in b.codes.tolist())


def test_fast_and_generic_paths_release_the_same_records_under_test1():
    codes = _data()
    with BeamTestPipeline(options=OPTIONS) as p:
        batches = p | beam.Create(_batches(codes))
        seeds = batches  # the whole data as seeds; the model from a separate split of the same data
        parts = batches | "Split" >> SplitForPlausible(seed=2)
        model = parts | "Model" >> DPPlausibleBayesNet(shape=SHAPE, budget=PureDP(epsilon=5.0), omega=1, seed=2)
        n_seeds = p | "N" >> beam.Create([len(codes)])
        rows = p | "Rows" >> beam.Create([4000])
        cands = seeds | "Cands" >> GenerateCandidates(model=model, rows=rows, n_seeds=n_seeds, seed=2)
        common = dict(records=seeds, model=model, k=50, gamma=4.0, epsilon0=None, seed=2)
        fast = cands | "Fast" >> PlausibleDeniabilityFilter(**common)
        generic = cands | "Generic" >> PlausibleDeniabilityFilter(
            **common, fast_path=False, max_check_plausible=len(codes))

        def tagged(pc, tag, label):
            return pc | label >> beam.Map(lambda b, t=tag: (t, b.codes.tolist()))

        both = (tagged(fast["released"], "fast", "TF"), tagged(generic["released"], "generic", "TG"),
                tagged(fast["rejected"], "fast_rej", "TFR"), tagged(generic["rejected"], "gen_rej", "TGR")) \
            | beam.Flatten() | beam.combiners.ToList()

        def check(elements):
            (lists,) = elements
            got = {}
            for tag, rows in lists:
                got.setdefault(tag, []).extend(tuple(r) for r in rows)
            assert sorted(got.get("fast", [])) == sorted(got.get("generic", []))
            assert sorted(got.get("fast_rej", [])) == sorted(got.get("gen_rej", []))
            total = len(got.get("fast", [])) + len(got.get("fast_rej", []))
            assert 3000 < total < 5000  # Poisson(4000) candidates
            assert got.get("fast") and got.get("fast_rej")  # both outputs used

        assert_that(both, check)


def test_unique_record_is_never_released_under_test1():
    codes = _data(2000, seed=4)
    unique = np.array([[2, 1, 3, 2]])
    codes = codes[~np.any(codes == unique, axis=1)]  # nobody else shares any value with it
    codes = np.concatenate([codes, unique])
    with BeamTestPipeline(options=OPTIONS) as p:
        seeds = p | "Seeds" >> beam.Create(_batches(codes))
        train = p | "Train" >> beam.Create(_batches(_data(3000, seed=5)))
        model = {"structure": train, "params": train} | DPPlausibleBayesNet(
            shape=SHAPE, budget=PureDP(epsilon=3.0), omega=1, seed=2)
        n_seeds = p | "N" >> beam.Create([len(codes)])
        rows = p | "Rows" >> beam.Create([40 * len(codes)])  # ~40 candidates from the unique seed
        cands = seeds | GenerateCandidates(model=model, rows=rows, n_seeds=n_seeds, seed=2)
        out = cands | PlausibleDeniabilityFilter(records=seeds, model=model, k=2, gamma=4.0, epsilon0=None, seed=2)

        def no_unique(batches):
            for b in batches:
                # any candidate of the unique seed keeps >= 3 of its 4 values; others have <= 1
                assert (np.sum(b.codes == unique, axis=1) <= 1).all()

        def unique_rejected(batches):
            hits = sum(int((np.sum(b.codes == unique, axis=1) >= 3).sum()) for b in batches)
            assert hits > 0  # the unique seed did produce candidates, and they were rejected

        assert_that(out["released"], no_unique, label="NoUniqueReleased")
        assert_that(out["rejected"], unique_rejected, label="UniqueRejected")


def _adult_head(tmp_path, n=6000):
    import pandas as pd

    src = tmp_path / "in.csv"
    df = pd.read_csv("examples/data/adult/adult.csv", dtype=str, keep_default_na=False).head(n)
    df.to_csv(src, index=False)
    return src


def test_synthesize_cli_plausible_writes_released_rows_and_manifest(tmp_path):
    import pandas as pd

    from beamsynth.pipelines.cli.main import main

    src = _adult_head(tmp_path)
    out = tmp_path / "out.csv"
    rc = main(["synthesize", str(src), "--schema", "adult", "--epsilon", "5000", "--delta", "1e-6",
               "--output", str(out), "--method", "plausible", "--k", "50", "--gamma", "4",
               "--epsilon0", "1", "--omega", "12", "--rows", "3000", "--seed", "7", "--generator", "privbayes",
               "--runner=DirectRunner"])
    assert rc == 0
    man = json.loads((tmp_path / "out.csv.manifest.json").read_text())
    assert "WARNING" not in man["release"]
    det = man["release"]["details"]["method"]
    assert det["generator"] == "privbayes" and det["model"]["privbayes"]["degree"] >= 0
    op = man["operational"]["method"]
    assert op["tested"] == op["candidates"] > 2000
    # private diagnostics stay out of the release part: tested/candidates are 0 exactly when the
    # seed split is empty, so they would reveal it (H28's neighbour pair)
    assert not {"rejection_reasons", "tested", "candidates", "pass_rate"} & set(det)
    assert "candidates_tested" not in det["release_guarantee"] and "composed" not in det["release_guarantee"]
    rej = op["rejection_reasons"]
    assert det["released"] + sum(v for v in rej.values()) == op["tested"]
    assert op["pass_rate"] == pytest.approx(det["released"] / op["tested"])
    assert man["release"]["rows_out"] == det["released"]
    g = det["release_guarantee"]["per_record"]
    assert g["t"] == 25 and g["delta"] == pytest.approx(np.exp(-25))
    spends = {s["step"]: s for s in man["release"]["budget"]["spends"]}
    model = {k: v for k, v in spends.items() if k != "plausible.candidates"}
    assert "plausible.model.marginals" in model and all(k.startswith("plausible.model.") for k in model)
    assert sum(v["epsilon"] for v in model.values()) == pytest.approx(0.1 * 5000)
    cand = spends["plausible.candidates"]
    assert cand["details"]["C"] >= op["tested"]  # the public bound covers the realized count
    assert cand["epsilon"] == pytest.approx(cand["details"]["C"] * g["epsilon"])
    assert man["release"]["budget"]["spent"]["epsilon"] <= 5000
    # per-record and dataset-level guarantees side by side (Theorem 1; C·ε₁; + the model)
    rows = det["release_guarantee"]["side_by_side"]
    assert [r["epsilon"] for r in rows] == pytest.approx(
        [g["epsilon"], cand["epsilon"], cand["epsilon"] + 0.1 * 5000])
    written = pd.read_csv(out)
    assert len(written) == det["released"]


def _explode(*_a, **_k):
    raise AssertionError("the data was read although the plan overspends")


def test_overspending_plausible_raises_before_reading_data(tmp_path, monkeypatch, capsys):
    import beamsynth.pipelines.io.read as io_mod
    import beamsynth.pipelines.methods.synthesize as syn
    from beamsynth.pipelines.cli.main import main

    monkeypatch.setattr(syn, "ReadRecords", _explode)
    monkeypatch.setattr(io_mod, "iter_raw_blocks", _explode)
    src = _adult_head(tmp_path, 100)
    args = ["synthesize", str(src), "--schema", "adult", "--output", str(tmp_path / "o.csv"),
            "--method", "plausible", "--k", "50", "--gamma", "4", "--epsilon0", "1", "--rows", "1000",
            "--runner=DirectRunner"]
    for extra, msg in [
        (["--epsilon", "1", "--delta", "1e-6"], "need a total ε ≥ 149"),
        (["--epsilon", "1", "--plausible-test", "deterministic"], "--allow-non-dp"),
    ]:
        assert main(args + extra) == 2
        assert msg in capsys.readouterr().err
    assert main([a for a in args if a not in ("--rows", "1000")] + ["--epsilon", "1", "--delta", "1e-6"]) == 2
    assert "needs a public --rows" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="the data was read"):  # a generous budget gets to the reader
        main(args + ["--epsilon", "2000", "--delta", "1e-6"])
    assert not (tmp_path / "o.csv.manifest.json").exists()


def test_non_dp_release_is_flagged_in_the_manifest(tmp_path):
    from beamsynth.pipelines.cli.main import main

    src = _adult_head(tmp_path, 3000)
    out = tmp_path / "out.csv"
    rc = main(["synthesize", str(src), "--schema", "adult", "--epsilon", "1", "--output", str(out),
               "--method", "plausible", "--k", "10", "--omega", "15", "--plausible-test", "deterministic",
               "--allow-non-dp", "--rows", "500", "--seed", "3", "--generator", "cfs", "--runner=DirectRunner"])
    assert rc == 0
    man = json.loads((tmp_path / "out.csv.manifest.json").read_text())
    assert next(iter(man["release"])) == "WARNING"  # first key of the release part
    assert man["release"]["WARNING"].startswith("NOT DIFFERENTIALLY PRIVATE")
    assert man["release"]["details"]["method"]["release_guarantee"]["differential_privacy"] is False
    assert [s["step"] for s in man["release"]["budget"]["spends"]] == ["plausible.model"]


def test_generic_path_with_another_model_matches_the_beam_free_count():
    from beamsynth.transforms.plausible import (
        CandidateBatch,
        PerturbationModel,
        count_plausible_generic,
    )

    model = PerturbationModel(shape=SHAPE, p=0.5)
    data = _data(400, seed=8)
    rs = RandomSource(seed=8)
    y, logp = model.generate(data[rs.integers(len(data), 600)], rs.child("g"))
    kp = count_plausible_generic(logp, model.log_prob(y, data), 2.0)
    expected = sorted(tuple(r) for r in y[kp >= 30].tolist())
    assert 0 < len(expected) < len(y)
    with BeamTestPipeline(options=OPTIONS) as p:
        records = p | "Records" >> beam.Create(_batches(data, 150))
        models = p | "Model" >> beam.Create([model])
        cands = p | "Cands" >> beam.Create([CandidateBatch(y[i:i + 200], logp[i:i + 200], str(i))
                                           for i in range(0, len(y), 200)])
        out = cands | PlausibleDeniabilityFilter(records=records, model=models, k=30, gamma=2.0, epsilon0=None,
                                                 fast_path=False, max_check_plausible=len(data), seed=3)
        rows = out["released"] | beam.FlatMap(lambda b: [tuple(r) for r in b.codes.tolist()])
        assert_that(rows | beam.combiners.ToList() | beam.Map(sorted), lambda got: _eq(got, expected))


def _eq(got, expected):
    assert got == [expected]


def test_order_released_output_does_not_depend_on_batching_or_arrival_order():
    from beamsynth.transforms.plausible import OrderReleased, ordered_release

    codes = _data(900, seed=6)
    expected = [(label, rows.tolist()) for label, rows in
                ordered_release(codes, shape=SHAPE, shards=5, seed=2)]
    perm = RandomSource(seed=1).uniform(len(codes)).argsort()
    with BeamTestPipeline(options=OPTIONS) as p:
        for name, batches in (("InOrder", _batches(codes, 300)), ("Permuted", _batches(codes[perm], 70))):
            got = (p | f"Create{name}" >> beam.Create(batches)
                   | f"Order{name}" >> OrderReleased(shape=SHAPE, shards=5, seed=2)
                   | f"AsLists{name}" >> beam.Map(lambda kv: (kv[0], kv[1].codes.tolist()))
                   | f"All{name}" >> beam.combiners.ToList()
                   | f"Sort{name}" >> beam.Map(sorted))
            assert_that(got, lambda g: _eq(g, expected), label=f"Check{name}")


def test_identical_seed_batches_draw_independent_candidates():
    """Mechanism 1's invocations must be independent: two seed batches with the same content (a
    file of repeated blocks, few distinct values, one-row API batches) drew their Poisson counts,
    candidates and test thresholds from streams keyed by the batch's *content*, so they produced
    the same candidates twice. Neighbour pair: 2·b identical rows in two batches give an even
    number of candidates (each candidate doubled) always; 2·b + 1 rows give an odd number about
    half the time (Poisson(rows)), so the release told them apart with δ ≈ 1/2."""
    from beamsynth.transforms.plausible import PerturbationModel

    block = _data(300, seed=7)
    with BeamTestPipeline(options=OPTIONS) as p:
        seeds = p | "Seeds" >> beam.Create([EncodedBatch(block.copy()), EncodedBatch(block.copy())])
        model = p | "Model" >> beam.Create([PerturbationModel(shape=SHAPE, p=0.5)])
        n_seeds = p | "N" >> beam.Create([2 * len(block)])
        rows = p | "Rows" >> beam.Create([1200])
        cands = seeds | GenerateCandidates(model=model, rows=rows, n_seeds=n_seeds, seed=3)
        collected = cands | beam.Map(lambda c: c.codes.tolist()) | beam.combiners.ToList()

        def not_doubled(lists):
            (parts,) = lists
            rows_ = [tuple(r) for part in parts for r in part]
            assert 900 < len(rows_) < 1500  # Poisson(1200)
            _, mult = np.unique(np.asarray(rows_), axis=0, return_counts=True)
            assert (mult % 2 == 1).any(), "every candidate drawn twice: the two batches drew alike"

        assert_that(collected, not_doubled)



def _split_rows(pc, name):
    """``(name, sorted [(part, row), ...])`` of a SplitForPlausible output."""
    tagged = [pc[t] | f"{name}{t}" >> beam.FlatMap(lambda b, t=t: [(t, tuple(r)) for r in b.codes.tolist()])
              for t in ("seeds", "structure", "params")]
    return (tagged | f"{name}Flat" >> beam.Flatten() | f"{name}List" >> beam.combiners.ToList()
            | f"{name}Sort" >> beam.Map(lambda rows, n=name: (n, sorted(rows))))


def test_split_without_ids_is_stable_independent_of_batching_and_of_equal_batches():
    """Rule 6 and parallel composition for records without privacy ids. The split drew from a
    stream keyed by the *batch's content*, so (a) the same records read in other batches got
    another split, (b) adding one record redrew every record of its batch, and (c) two batches of
    equal content (repeated blocks, few distinct values, one-row API batches) got the same split:
    each row's copy landed in the same part as its twin, so every part held each row an even
    number of times (a neighbour with one more copy: odd), and the parts were not independent."""
    codes = _data(600, seed=5)
    extra = codes[:1]  # a copy of an existing record: the hardest case for a stable split
    block = np.unique(_data(300, seed=7), axis=0)
    with BeamTestPipeline(options=OPTIONS) as p:
        one = p | "One" >> beam.Create([EncodedBatch(codes)]) | "S1" >> SplitForPlausible(seed=4)
        many = p | "Many" >> beam.Create(_batches(codes, 100)) | "S2" >> SplitForPlausible(seed=4)
        plus = (p | "Plus" >> beam.Create(_batches(np.concatenate([extra, codes]), 100))
                | "S3" >> SplitForPlausible(seed=4))
        twins = (p | "Twins" >> beam.Create([EncodedBatch(block.copy()), EncodedBatch(block.copy())])
                 | "S4" >> SplitForPlausible(seed=4))
        got = ((_split_rows(one, "one"), _split_rows(many, "many"), _split_rows(plus, "plus"),
                _split_rows(twins, "twins")) | "All" >> beam.Flatten() | "Collect" >> beam.combiners.ToList())

        def check(elements):
            (lists,) = elements
            got_ = dict(lists)
            assert got_["one"] == got_["many"], "the split depends on the batching"
            added = list((Counter(got_["plus"]) - Counter(got_["one"])).elements())
            assert len(added) == 1 and added[0][1] == tuple(extra[0].tolist()), "adding one record moved others"
            mult = Counter(got_["twins"])
            assert sum(mult.values()) == 2 * len(block)
            split_pairs = sum(1 for (_, r), c in mult.items() if c == 1) // 2
            # independent parts: a pair splits with probability 1 - (.25 + .04 + .09) = 0.62
            assert split_pairs > 0.4 * len(block), f"{split_pairs} of {len(block)} twin pairs split"

        assert_that(got, check)


def test_generic_check_sample_is_stable_and_independent_of_batching_and_equal_batches(tmp_path, monkeypatch):
    """The generic path compares candidates with a uniform sample of ``max_check`` seeds. Its tags
    came from a stream keyed by the batch's content: two equal seed batches got equal tags, so a
    row and its twin were sampled together (every row's multiplicity in the sample even), and the
    sample depended on the batching. Now tags are per (value, occurrence): the same sample for
    any batching, adding a seed changes it by at most one row in and one out."""
    from beamsynth.transforms import plausible_filter as P
    from beamsynth.transforms.plausible import PerturbationModel

    original = P._GenericTestFn.process

    def recording(self, cands, model, sample, window=beam.DoFn.WindowParam):
        (tmp_path / f"sample-{self._k}.json").write_text(json.dumps(np.asarray(sample).tolist()))
        return original(self, cands, model, sample, window)

    monkeypatch.setattr(P._GenericTestFn, "process", recording)
    block = _data(400, seed=7)
    extra = block[:1]
    layouts = {2: [EncodedBatch(block.copy()), EncodedBatch(block.copy())],   # equal batches
               3: [EncodedBatch(np.concatenate([block, block]))],             # one batch
               4: [EncodedBatch(np.concatenate([block, block, extra]))]}      # plus one seed
    with BeamTestPipeline(options=OPTIONS) as p:
        model = p | "Model" >> beam.Create([PerturbationModel(shape=SHAPE, p=0.5)])
        for k, batches in layouts.items():
            seeds = p | f"Seeds{k}" >> beam.Create(batches)
            n_seeds = p | f"N{k}" >> beam.Create([sum(len(b) for b in batches)])
            rows = p | f"Rows{k}" >> beam.Create([20])
            cands = seeds | f"Cands{k}" >> GenerateCandidates(model=model, rows=rows, n_seeds=n_seeds, seed=3)
            _ = cands | f"Test{k}" >> PlausibleDeniabilityFilter(
                records=seeds, model=model, k=k, gamma=4.0, epsilon0=None, fast_path=False,
                max_check_plausible=len(block), seed=5)
    sample = {k: Counter(tuple(r) for r in json.loads((tmp_path / f"sample-{k}.json").read_text()))
              for k in layouts}
    assert sum(sample[2].values()) == len(block)
    assert sample[2] == sample[3], "the sample depends on the batching"
    assert sum((sample[4] - sample[2]).values()) <= 1 and sum((sample[2] - sample[4]).values()) <= 1
    odd = sum(1 for c in sample[2].values() if c % 2)
    assert odd > 10, f"only {odd} rows sampled an odd number of times: twins sampled together"


_TOY_SCHEMA = """name: toy
columns:
  - {name: sex, type: categorical, domain: {kind: categorical, values: [F, M]}}
  - {name: city, type: categorical, domain: {kind: categorical, values: [Oslo, Rome, Lima, Kiev, Baku]}}
  - {name: band, type: integer, domain: {kind: integer, low: 0, high: 5}}
"""


def _toy_cli_manifest(folder, lines):
    from beamsynth.pipelines.cli.main import main

    folder.mkdir()
    (folder / "s.yaml").write_text(_TOY_SCHEMA, encoding="utf-8")
    (folder / "in.csv").write_text("sex,city,band\n" + "".join(f"{x}\n" for x in lines), encoding="utf-8")
    assert main(["synthesize", str(folder / "in.csv"), "--schema", str(folder / "s.yaml"), "--epsilon", "500",
                 "--delta", "1e-5", "--method", "plausible", "--rows", "100", "--seed", "3", "--quiet",
                 "--allow-empty", "--output", str(folder / "out.csv"), "--runner=DirectRunner"]) == 0
    return json.loads((folder / "out.csv.manifest.json").read_text())


def test_cli_manifest_public_part_hides_an_empty_seed_split(tmp_path):
    """Neighbours through the CLI (seed 3): D = 2 records whose seed split D_S is empty (0
    candidates) and D + one record that lands in D_S (~Poisson(100) candidates, none released).
    The number tested differs, so it must stay in the private operational part: until the tenth
    session the public part carried candidates / tested / pass_rate (0 vs 105 here)."""
    small = _toy_cli_manifest(tmp_path / "d", ["F,Oslo,0", "M,Rome,1"])
    large = _toy_cli_manifest(tmp_path / "d1", ["F,Oslo,0", "M,Rome,1", "F,Baku,4"])
    assert small["operational"]["method"]["tested"] == 0 < large["operational"]["method"]["tested"]
    pub = [m["release"]["details"]["method"] for m in (small, large)]
    assert pub[0]["released"] == pub[1]["released"] == 0
    assert pub[0] == pub[1]
