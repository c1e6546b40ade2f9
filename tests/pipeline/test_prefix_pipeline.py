"""Prefix transforms on the DirectRunner: structure with noise patched to zero, windows, the CLI."""

import json
from unittest import mock

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beamsynth.pipelines.cli.main import main
from beamsynth.schemas.keys import SpatialKeyCodec, TextKeyCodec
from beamsynth.schemas.schema import EncodedBatch
from beamsynth.transforms import prefix as P
from beamsynth.transforms import prefix_levels
from beamsynth.transforms.budget import PrivacyAccountant, PureDP
from beamsynth.transforms.windows import DeclaredWindows


def _opts():
    return PipelineOptions(["--runner=DirectRunner"])


def _zero_noise(rs, scale, size):
    return np.zeros(size, dtype=np.int64)


def _batches(codec, words, per=4):
    codes = codec.encode_strings(words)
    return [EncodedBatch(codes[i:i + per]) for i in range(0, len(words), per)]


def _leaf_rows(codec):
    def rows(rel):
        labels = codec.labels(rel.prefixes)
        return [(lab, int(c)) for lab, c, leaf in zip(labels, rel.counts.tolist(), rel.leaf.tolist()) if leaf]
    return rows


WORDS = ["ab"] * 40 + ["abc"] * 30 + ["b"] * 25 + ["ca"] * 3


def test_basic_with_zero_noise_releases_exact_leaves_and_spends_at_build():
    codec = TextKeyCodec(column="q", max_length=3, alphabet="abc")
    acct = PrivacyAccountant(total=PureDP(epsilon=2.0))
    with mock.patch.object(prefix_levels, "discrete_laplace", _zero_noise):
        t = P.DPBasicPrefixHistogram(codec=codec, budget=PureDP(epsilon=2.0), threshold=10, accountant=acct)
        assert acct.spent_epsilon == 2.0  # spent when the pipeline is built
        with BeamTestPipeline(options=_opts()) as p:
            rel = p | beam.Create(_batches(codec, WORDS)) | t
            leaves = rel | beam.FlatMap(_leaf_rows(codec))
            assert_that(leaves, equal_to([("ab$", 40), ("abc$", 30), ("b$", 25), ("c", 3)]))


def test_direct_with_zero_noise_allocates_exactly():
    codec = TextKeyCodec(column="q", max_length=3, alphabet="abc")
    with mock.patch.object(prefix_levels, "discrete_laplace", _zero_noise):
        with BeamTestPipeline(options=_opts()) as p:
            batches = p | beam.Create(_batches(codec, WORDS))
            rel = batches | P.DPDirectPrefixSynthesis(codec=codec, budget=PureDP(epsilon=1.0), prune=False, seed=1)
            keys = rel | P.DecodeLeaves(codec=codec, seed=1) | beam.FlatMap(lambda t: t.column("q").to_pylist())
            assert_that(keys, equal_to(["ab"] * 40 + ["abc"] * 30 + ["b"] * 25 + ["ca"] * 3))
            # pruned (default): 'c' (3 < threshold 6) takes no share; the root's 98 go to 'a' and 'b'
            pruned = (batches | "Pruned" >> P.DPDirectPrefixSynthesis(codec=codec, budget=PureDP(epsilon=1.0), seed=1)
                      | "Decode2" >> P.DecodeLeaves(codec=codec, seed=1)
                      | "Keys2" >> beam.FlatMap(lambda t: t.column("q").to_pylist()))
            assert_that(pruned | beam.combiners.Count.Globally(), equal_to([98]), label="total kept")
            assert_that(pruned | beam.Distinct(), equal_to(["ab", "abc", "b"]), label="only keys")


def test_direct_reduce_to_ancestor_writes_the_total_per_window():
    """'c' (8) splits but neither 'ca' nor 'cb' (4 each) reaches the threshold 6: pruned Center
    drops the 8; reduce-to-ancestor puts them on the keys below the root, 40 : 25 (largest
    remainder 5 + 3), so each window writes its released total. Windows are reduced apart."""
    codec = TextKeyCodec(column="q", max_length=3, alphabet="abc")
    first = _batches(codec, ["ab"] * 40 + ["b"] * 25 + ["ca"] * 4 + ["cb"] * 4)
    second = _batches(codec, ["ab"] * 30)

    def stamp(table, w=beam.DoFn.WindowParam):
        return [(int(w.start), q) for q in table.column("q").to_pylist()]

    with mock.patch.object(prefix_levels, "discrete_laplace", _zero_noise):
        with BeamTestPipeline(options=_opts()) as p:
            items = [window.TimestampedValue(b, 1) for b in first] + [window.TimestampedValue(b, 15) for b in second]
            rel = (p | beam.Create(items) | beam.WindowInto(DeclaredWindows(start=0, end=20, size=10))
                   | P.DPDirectPrefixSynthesis(codec=codec, budget=PureDP(epsilon=1.0), seed=1))
            plain = rel | "Plain" >> P.DecodeLeaves(codec=codec, seed=1) | "P" >> beam.FlatMap(stamp)
            reduced = rel | "Reduced" >> P.DecodeLeaves(codec=codec, seed=1, reduce=True) | "R" >> beam.FlatMap(stamp)
            assert_that(plain, equal_to([(0, "ab")] * 40 + [(0, "b")] * 25 + [(10, "ab")] * 30), label="dropped")
            assert_that(reduced, equal_to([(0, "ab")] * 45 + [(0, "b")] * 28 + [(10, "ab")] * 30), label="reduced")


def test_improved_runs_per_window_with_seeded_streams():
    codec = TextKeyCodec(column="q", max_length=3, alphabet="abc")
    first = _batches(codec, ["ab"] * 60)
    second = _batches(codec, ["c"] * 80)

    def run():
        with mock.patch.object(prefix_levels, "discrete_laplace", _zero_noise):
            with BeamTestPipeline(options=_opts()) as p:
                items = [window.TimestampedValue(b, 1) for b in first] + [
                    window.TimestampedValue(b, 15) for b in second]
                tree = P.DPImprovedPrefixHistogram(codec=codec, budget=PureDP(epsilon=4.0),
                                                   threshold=5, discount="skip", seed=3)
                rel = (p | beam.Create(items) | "Fixed" >> beam.WindowInto(DeclaredWindows(start=0, end=20, size=10))
                       | tree)
                t = tree.accounting.discount
                leaves = (rel | "Global" >> beam.WindowInto(window.GlobalWindows())
                          | beam.FlatMap(_leaf_rows(codec)))
                # each window is its own tree: 'ab$' lost t at the root, 'a' and 'ab' splits
                assert_that(leaves, equal_to([("ab$", 60 - 3 * t), ("c$", 80 - 2 * t)]))
    run()


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return str(p)


def test_cli_text_end_to_end(tmp_path):
    rows = "".join(f"{i % 7},{w}\n" for i, w in enumerate(["The"] * 30 + ["tea"] * 20 + ["don't"] * 2 + ["x"]))
    inp = _write(tmp_path, "q.csv", "user_id,query\n" + rows)
    out = str(tmp_path / "out.csv")
    rc = main(["--quiet", "prefixes", inp, "--kind", "text", "--column", "query", "--max-length", "4",
               "--method", "improved", "--epsilon", "8", "--output", out, "--privacy-id", "user_id",
               "--max-contributions", "5", "--seed", "2", "--restore-discount", "--calibration", "theorem3"])
    assert rc == 0
    man = json.loads((tmp_path / "out.csv.manifest.json").read_text())
    assert man["release"]["details"]["restore_discount"] is True
    op, rel = man["operational"], man["release"]
    assert op["rows_read"] == 53 and op["rows_used"] == 35 and op["rows_rejected"] == 2  # used: after
    assert op["rows_dropped_by_bound"] == 16  # the bound of 5 per user (51 encoded rows, 7 users)
    assert rel["budget"]["spent"]["epsilon"] == 8.0
    assert rel["details"]["accounting"]["max_contributions"] == 5
    # the guarantee's neighbouring relation, as synthesize's and histogram's manifests state it
    assert rel["privacy_unit"]["neighbouring"] == "add/remove one privacy unit", rel["privacy_unit"]
    assert rel["details"]["accounting"]["scale"] == 2 * 5 / 8  # the paper's ε₀ = ε/(2k)
    synth = (tmp_path / "out.csv").read_text().splitlines()
    assert synth[0] == "query" and all(len(s) <= 4 for s in synth[1:])
    assert (tmp_path / "out.csv.tree.csv").read_text().startswith("depth,prefix,count,leaf")
    rejected = [json.loads(x) for x in (tmp_path / "out.csv.rejected.jsonl").read_text().splitlines()]
    assert len(rejected) == 2 and all("alphabet" in r["reason"] for r in rejected)


def test_cli_direct_text_writes_the_noisy_total(tmp_path):
    """Eight rare 't?q' keys (3 each) are pruned inside 't': reduce-to-ancestor (the default for
    direct) puts their mass on 'tea'/'ten', so OUT holds the released total (depth-1 allocations)."""
    rows = "".join(f"{i},{w}\n" for i, w in enumerate(["tea"] * 60 + ["ten"] * 40 + [f"t{c}q" for c in "abcdefgh"] * 3))
    inp = _write(tmp_path, "q.csv", "user_id,query\n" + rows)
    out = str(tmp_path / "out.csv")
    rc = main(["--quiet", "prefixes", inp, "--kind", "text", "--column", "query", "--max-length", "4",
               "--method", "direct", "--epsilon", "2", "--output", out, "--privacy-id", "user_id", "--seed", "3"])
    assert rc == 0
    man = json.loads((tmp_path / "out.csv.manifest.json").read_text())
    tree = [ln.split(",") for ln in (tmp_path / "out.csv.tree.csv").read_text().splitlines()[1:]]
    total = sum(int(c) for d, _p, c, _leaf in tree if d == "1")  # the released total
    written = (tmp_path / "out.csv").read_text().splitlines()[1:]
    assert len(written) == total == man["release"]["rows_out"]
    assert set(written) <= {"tea", "ten"} | {f"t{c}q" for c in "abcdefgh"}
    assert man["release"]["details"]["reduce_to_ancestor"] is True
    assert man["operational"]["incomplete_leaf_mass_dropped"] == 0
    assert man["operational"]["mass_reduced_to_keys"] > 0


def test_cli_direct_reduce_flag_reaches_the_pipeline(tmp_path):
    inp = _write(tmp_path, "q.csv", "query\nab\n")
    seen = []

    def fake(**kw):
        seen.append(kw.get("reduce"))
        return {"operational": {"rows_read": 1, "rows_rejected": 0, "rows_used": 1},
                "release": {"rows_out": 1, "budget": {"spends": []}}}

    with mock.patch("beamsynth.pipelines.cli.prefixes.run_prefixes", fake):
        for flag in ([], ["--no-reduce"]):
            assert main(["--quiet", "prefixes", inp, "--kind", "text", "--column", "query", "--method", "direct",
                         "--epsilon", "1", "--output", str(tmp_path / "o.csv"), *flag]) == 0
    assert seen == [True, False]


def test_cli_spatial_and_bad_arguments(tmp_path, capsys):
    rng = np.random.default_rng(0)
    pts = "".join(f"{a:.4f},{b:.4f}\n" for a, b in rng.uniform(0, 1, (200, 2)))
    inp = _write(tmp_path, "p.csv", "x,y\n" + pts + "5,5\n")
    out = str(tmp_path / "pts.csv")
    rc = main(["--quiet", "prefixes", inp, "--kind", "spatial", "--columns", "x,y", "--box", "0,1;0,1",
               "--depth", "4", "--method", "direct", "--epsilon", "2", "--output", out, "--seed", "1"])
    assert rc == 0
    lines = (tmp_path / "pts.csv").read_text().splitlines()
    assert lines[0] == "x,y"
    vals = np.array([[float(v) for v in ln.split(",")] for ln in lines[1:]])
    assert ((vals >= 0) & (vals <= 1)).all()
    man = json.loads((tmp_path / "pts.csv.manifest.json").read_text())
    assert man["operational"]["rows_rejected"] == 1
    assert "threshold" not in man["release"]["details"]["accounting"]  # cells are keys: no pruning
    rc = main(["prefixes", inp, "--kind", "spatial", "--columns", "x,y", "--box", "0,1", "--method", "improved",
               "--epsilon", "1", "--output", out])
    assert rc == 2
    assert "--box ('0,1') needs one 'lo,hi' pair per column (2)" in capsys.readouterr().err


def test_direct_spatial_leaves_sum_to_the_root_allocation():
    codec = SpatialKeyCodec(columns=("x", "y"), box=((0, 1), (0, 1)), depth=3)
    codes = codec.encode_points(np.full((50, 2), 0.1))
    with BeamTestPipeline(options=_opts()) as p:
        rel = p | beam.Create([EncodedBatch(codes)]) | P.DPDirectPrefixSynthesis(
            codec=codec, budget=PureDP(epsilon=3.0), seed=5)
        assert_that(rel | beam.combiners.ToList(), _leaves_sum_to_root)


def _leaves_sum_to_root(got):
    (rels,) = got
    root = sum(int(r.counts.sum()) for r in rels if r.depth == 1)
    leaves = sum(int(r.counts[r.leaf].sum()) for r in rels)
    assert leaves == root and all((r.counts >= 1).all() for r in rels)


def test_cli_hierarchy_from_a_declared_tree(tmp_path):
    tree = _write(tmp_path, "tree.yaml", "CA: {QC: [Montreal, Quebec], ON: [Toronto]}\nFR: {IDF: [Paris]}\n")
    rows = "CA,QC,Montreal\n" * 40 + "FR,IDF,Paris\n" * 30 + "FR,QC,Paris\n"
    inp = _write(tmp_path, "h.csv", "country,region,city\n" + rows)
    out = str(tmp_path / "h.csv.out.csv")
    rc = main(["--quiet", "prefixes", inp, "--kind", "hierarchy", "--columns", "country,region,city",
               "--tree", tree, "--method", "direct", "--epsilon", "20", "--output", out, "--seed", "4"])
    assert rc == 0
    lines = (tmp_path / "h.csv.out.csv").read_text().splitlines()
    assert lines[0] == "country,region,city"
    declared = {"CA,QC,Montreal", "CA,QC,Quebec", "CA,ON,Toronto", "FR,IDF,Paris"}
    assert set(lines[1:]) <= declared and len(lines) > 50
    rejected = (tmp_path / "h.csv.out.csv.rejected.jsonl").read_text()
    assert "region value 'QC' is not declared under FR" in rejected


def test_level_side_inputs_come_from_one_output_steps():
    """Each level's frontier reaches the next level as a singleton view of a one-output step. A
    view of the multi-output level step's main output made Beam's BundleBasedDirectRunner (the
    DirectRunner on streams) hand it both outputs at random (apache/beam#19540: 'PCollection of
    size 2 with more than one element accessed as a singleton view'; `beamsynth prefixes
    --runner=BundleBasedDirectRunner` failed 3 of 6 runs)."""
    codec = TextKeyCodec(column="q", max_length=3, alphabet="abc")
    p = beam.Pipeline()
    batches = p | beam.Create(_batches(codec, WORDS))
    _ = batches | P.DPBasicPrefixHistogram(codec=codec, budget=PureDP(epsilon=1.0), seed=1)
    producers = {}

    class _Visit(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            for out in node.outputs.values():
                producers[out] = node
            for view in node.side_inputs:
                producer = producers[view.pvalue]
                assert len(producer.outputs) == 1, (node.full_label, producer.full_label)
                seen.append(node.full_label)

    seen: list = []
    p.visit(_Visit())
    assert seen, "no level step reads a side input"


def test_cli_prefixes_on_the_bundle_based_runner_match_the_default(tmp_path):
    words = ["ab", "abc", "b", "ba", "bca", "c", "ca"]
    rows = "".join(f"u{(i * 7) % 150},{words[(i * 5) % 7]}\n" for i in range(600))
    inp = _write(tmp_path, "q.csv", "user_id,query\n" + rows)
    outs = []
    for name, runner in (("fn", []), ("bundle", ["--runner=BundleBasedDirectRunner"])):
        out = str(tmp_path / f"{name}.csv")
        assert main(["--quiet", "prefixes", inp, "--kind", "text", "--column", "query",
                     "--max-length", "3", "--method", "basic", "--epsilon", "4", "--output", out,
                     "--privacy-id", "user_id", "--max-contributions", "3", "--seed", "1"] + runner) == 0
        outs.append((tmp_path / f"{name}.csv").read_bytes())
    assert outs[0] == outs[1]
