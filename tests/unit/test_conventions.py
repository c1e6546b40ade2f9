"""Beam conventions on beamsynth's PTransforms (issue 16): element types checked when the pipeline
is built, typed outputs, and display data (mechanism, ε, δ, scales, sizes; never data values).

All checks here build pipelines without running them (fast). The run-time check of inputs of
unknown element type is in tests/pipeline/test_element_types.py.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.transforms.display import DisplayData, DisplayDataItem
from apache_beam.typehints import typehints

import beamsynth.pipelines
import beamsynth.transforms
from beamsynth.schemas.domains import CategoricalDomain
from beamsynth.schemas.keys import TextKeyCodec
from beamsynth.schemas.schema import EncodedBatch, load_schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant, PureDP
from beamsynth.transforms.conventions import (
    API_HINT,
    ElementTypeError,
    conforms,
    describe_type,
    display_items,
)
from beamsynth.transforms.measure import DPMarginals, NoisyMarginal
from beamsynth.transforms.plausible import SplitForPlausible
from beamsynth.transforms.synthesis import DPCount, DPIndependentMarginals, NoisyCount

SCHEMA = load_schema("adult")


def _batches(p: beam.Pipeline) -> beam.PCollection:
    codes = np.zeros((4, len(SCHEMA.columns)), dtype=np.int64)
    return p | "Batches" >> beam.Create([EncodedBatch(codes)])


# -- element types ----------------------------------------------------------------------------------
def test_dicts_into_a_mechanism_fail_when_the_pipeline_is_built():
    p = beam.Pipeline()
    dicts = p | beam.Create([{"age": 30}, {"age": 41}])
    with pytest.raises(ElementTypeError) as err:
        _ = dicts | DPIndependentMarginals(schema=SCHEMA, budget=PureDP(epsilon=1.0))
    assert str(err.value) == ("DPIndependentMarginals takes EncodedBatch elements; got "
                              f"Dict[str, int] — {API_HINT}")


def test_outputs_are_typed_so_miswiring_our_own_transforms_fails_when_built():
    p = beam.Pipeline()
    batches = _batches(p)
    tables = batches | DPMarginals(specs=[(0,)], shape=SCHEMA.shape, names=SCHEMA.names,
                                   budgets=[PureDP(epsilon=1.0)])
    assert tables.element_type == typehints.Tuple[NoisyMarginal, ...]
    assert (batches | "Count" >> DPCount(budget=PureDP(epsilon=1.0))).element_type is NoisyCount
    with pytest.raises(ElementTypeError) as err:
        _ = tables | "Miswired" >> DPCount(budget=PureDP(epsilon=1.0))
    assert str(err.value) == f"DPCount takes EncodedBatch elements; got Tuple[NoisyMarginal, ...] — {API_HINT}"


def test_typed_inputs_get_no_check_step():
    p = beam.Pipeline()
    _ = _batches(p) | DPCount(budget=PureDP(epsilon=1.0))
    untyped = p | "Untyped" >> beam.Create([0]) | beam.Map(lambda _: 0).with_output_types(
        typehints.Any)
    _ = untyped | "C2" >> DPCount(budget=PureDP(epsilon=1.0))
    labels = [t.unique_name for t in p.to_runner_api().components.transforms.values()]
    assert [n for n in labels if n.endswith("CheckElements")] == ["C2/CheckElements"]


def test_named_inputs_and_outputs():
    p = beam.Pipeline()
    parts = _batches(p) | SplitForPlausible(seed=1)
    assert {k: v.element_type for k, v in parts.items()} == {
        "seeds": EncodedBatch, "structure": EncodedBatch, "params": EncodedBatch}
    from beamsynth.transforms.plausible import DPPlausibleBayesNet

    wrong = {"structure": parts["structure"], "params": p | "Ints" >> beam.Create([1, 2])}
    with pytest.raises(ElementTypeError) as err:
        _ = wrong | DPPlausibleBayesNet(shape=(2, 3), budget=PureDP(epsilon=1.0), omega=1)
    assert str(err.value) == (f"DPPlausibleBayesNet takes EncodedBatch elements (input 'params'); "
                              f"got int — {API_HINT}")


def test_type_helpers():
    assert describe_type(dict) == "dict"
    assert describe_type(typehints.Tuple[NoisyMarginal, int]) == "Tuple[NoisyMarginal, int]"
    assert conforms((object.__new__(NoisyCount), np.int64(3)), tuple[NoisyCount, int])
    assert not conforms((1, 2), tuple[NoisyCount, int])
    assert not conforms(True, int) and conforms(np.int32(1), int)
    assert not conforms({"a": 1}, EncodedBatch)
    assert conforms({"a": 1}, typehints.Any)


def test_display_items():
    items = display_items(epsilon=0.5, cells=10**30, k=3, note=None, flag=True)
    assert {k: v.value for k, v in items.items()} == {
        "epsilon": 0.5, "cells": str(10**30), "k": 3, "note": "none", "flag": True}
    assert items["epsilon"].label == "epsilon"


# -- display data on every public PTransform ---------------------------------------------------------
# Transforms of concurrent work whose owners add their display data (none left at the moment).
PENDING: set[str] = set()
# The public API (import beamsynth as bs) has its own display-data tests.
API_MODULES = {"beamsynth.transforms.private", "beamsynth.transforms.private_ops",
               "beamsynth.transforms.outputs", "beamsynth.pipelines.job"}


def _public_transform_classes() -> dict[str, type]:
    """``{"module.Class": class}`` of every public PTransform defined in transforms/ and pipelines/."""
    found = {}
    for package in (beamsynth.transforms, beamsynth.pipelines):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):  # subpackages too
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (inspect.isclass(obj) and issubclass(obj, beam.PTransform)
                        and obj.__module__ == module.__name__ and not name.startswith("_")):
                    found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_public_ptransform_defines_display_data():
    classes = _public_transform_classes()
    assert {"beamsynth.transforms.measure.DPMarginals", "beamsynth.pipelines.io.read.ReadRecords",
            "beamsynth.pipelines.stream.WindowedSynthesis"} <= set(classes)  # the search works
    lacking = sorted(n for n, c in classes.items()
                     if c.display_data is beam.PTransform.display_data
                     and c.__name__ not in PENDING and c.__module__ not in API_MODULES)
    assert lacking == []


SENTINEL = "sentinel-category-value"


def _factories(tmp_path) -> dict:
    """One instance of every public PTransform whose display data is checked in detail."""
    from beamsynth.pipelines.io.dead_letters import NumberRejected
    from beamsynth.pipelines.io.encode import EncodeBlocks
    from beamsynth.pipelines.io.read import ReadRawBlocks, ReadRecords
    from beamsynth.pipelines.io.single_file import WriteSingleFile, WriteSortedLines
    from beamsynth.pipelines.io.write import WriteTables
    from beamsynth.pipelines.methods.plausible import PlausibleSynthesis
    from beamsynth.pipelines.methods.prefixes import EncodeKeys, make_transform
    from beamsynth.pipelines.methods.synthesize import SynthesisConfig, plan_synthesis
    from beamsynth.pipelines.stream import WindowedSynthesis, WindowHeartbeat
    from beamsynth.pipelines.yaml_transforms import Synthesize
    from beamsynth.transforms.cathist import DPCategoricalHistogram, SampleCategoricalColumn
    from beamsynth.transforms.inputs import EncodeElements, KeyLayout
    from beamsynth.transforms.plausible import (
        DPPlausibleBayesNet,
        DPPrivBayesGenerator,
        GenerateCandidates,
        OrderReleased,
        PlausibleDeniabilityFilter,
    )
    from beamsynth.transforms.prefix import DecodeLeaves
    from beamsynth.transforms.privbayes import DPPrivBayes, PrivBayesSynthesizer
    from beamsynth.transforms.sbhg import DPHashedConditionals
    from beamsynth.transforms.synthesis import SampleSynthetic
    from beamsynth.transforms.units import BoundContributions
    from beamsynth.transforms.windows import (
        CombineDeclaredWindows,
        DeclaredWindows,
        DropOutsideDeclared,
        Heartbeats,
        SplitLate,
    )

    csv = tmp_path / "in.csv"
    csv.write_text(",".join(SCHEMA.names) + "\n", encoding="utf-8")
    out = str(tmp_path / "out.csv")
    domain = CategoricalDomain(["a", "b", SENTINEL])
    codec = TextKeyCodec(column="q", max_length=3)
    plan = plan_synthesis(SynthesisConfig(input="stream", schema=SCHEMA, output=out, epsilon=1.0))
    prefix = {m: make_transform(method=m, codec=codec, epsilon=1.0, max_contributions=1, seed=None,
                                accountant=PrivacyAccountant(total=PureDP(epsilon=1.0)))
              for m in ("basic", "improved", "direct")}
    days = DeclaredWindows(start=0, end=3 * 86400, size=86400)
    return {
        "EncodeElements": EncodeElements(layout=KeyLayout(SCHEMA), source="events"),
        "Heartbeats": Heartbeats(days),
        "DropOutsideDeclared": DropOutsideDeclared(days),
        "CombineDeclaredWindows": CombineDeclaredWindows(beam.combiners.CountCombineFn(), days),
        "SplitLate": SplitLate(),
        "DPMarginals": DPMarginals(specs=[(0,), (1, 2)], shape=SCHEMA.shape, names=SCHEMA.names,
                                   budgets=[PureDP(epsilon=0.25), PureDP(epsilon=0.75)]),
        "DPCount": DPCount(budget=PureDP(epsilon=0.5)),
        "DPIndependentMarginals": DPIndependentMarginals(schema=SCHEMA, budget=PureDP(epsilon=1.0)),
        "SampleSynthetic": SampleSynthetic(schema=SCHEMA),
        "BoundContributions": BoundContributions(max_contributions=2),
        "DPCategoricalHistogram": DPCategoricalHistogram(domain=domain, budget=PureDP(epsilon=1.0),
                                                         tolerance=0.5),
        "SampleCategoricalColumn": SampleCategoricalColumn(domain=domain, rows=10),
        "DPPrivBayes": DPPrivBayes(schema=SCHEMA, budget=PureDP(epsilon=1.0)),
        "PrivBayesSynthesizer": PrivBayesSynthesizer(schema=SCHEMA, budget=PureDP(epsilon=1.0)),
        "DPHashedConditionals": DPHashedConditionals(
            shape=(3, 4, 5), selection_budget=PureDP(epsilon=0.2),
            conditional_budget=ApproxDP(epsilon=0.8, delta=1e-6)),
        "SplitForPlausible": SplitForPlausible(),
        "DPPlausibleBayesNet": DPPlausibleBayesNet(shape=(3, 4), budget=PureDP(epsilon=1.0), omega=1),
        "DPPrivBayesGenerator": DPPrivBayesGenerator(schema=SCHEMA, budget=PureDP(epsilon=1.0), omega=1),
        "GenerateCandidates": GenerateCandidates(model=None, rows=None, n_seeds=None),
        "OrderReleased": OrderReleased(shape=(3, 4)),
        "PlausibleDeniabilityFilter": PlausibleDeniabilityFilter(records=None, model=None, k=10,
                                                                 gamma=2.0, epsilon0=0.5),
        "DPBasicPrefixHistogram": prefix["basic"],
        "DPImprovedPrefixHistogram": prefix["improved"],
        "DPDirectPrefixSynthesis": prefix["direct"],
        "DecodeLeaves": DecodeLeaves(codec=codec),
        "NumberRejected": NumberRejected(),
        "ReadRawBlocks": ReadRawBlocks(str(csv)),
        "EncodeBlocks": EncodeBlocks(SCHEMA),
        "ReadRecords": ReadRecords(str(csv), SCHEMA),
        "WriteTables": WriteTables(out, column_names=SCHEMA.names),
        "WriteSingleFile": WriteSingleFile(out, fmt="csv", column_names=SCHEMA.names),
        "WriteSortedLines": WriteSortedLines(out),
        "WindowHeartbeat": WindowHeartbeat(schema=SCHEMA, windows_start=0, windows_end=86400),
        "WindowedSynthesis": WindowedSynthesis(plan=plan, output=out, windows_start=0,
                                               windows_end=86400),
        "EncodeKeys": EncodeKeys(codec=codec),
        "PlausibleSynthesis": PlausibleSynthesis(schema=SCHEMA, rows=None, budget=PureDP(epsilon=1.0),
                                                 k=10, gamma=2.0, epsilon0=None, omega=1),
        "Synthesize": Synthesize(schema="adult", epsilon=1.0),
        **_yaml_stats_steps(),
    }


def _yaml_stats_steps() -> dict:
    from beamsynth.pipelines import yaml_stats

    return {"YamlHistogram": yaml_stats.Histogram(schema="adult", column="age", epsilon=1.0),
            "YamlMarginals": yaml_stats.Marginals(schema="adult", marginals=[["sex"]], epsilon=1.0),
            "YamlCount": yaml_stats.Count(schema="adult", epsilon=1.0),
            "YamlPrefixes": yaml_stats.Prefixes(schema="adult", epsilon=1.0,
                                                key={"kind": "text", "column": "sex"})}


# transforms that release DP values (the rest read, write, bound, split or post-process)
MECHANISMS = {"DPMarginals", "DPCount", "DPIndependentMarginals", "DPCategoricalHistogram",
              "DPPrivBayes", "PrivBayesSynthesizer", "DPHashedConditionals", "DPPlausibleBayesNet",
              "DPPrivBayesGenerator",
              "DPBasicPrefixHistogram", "DPImprovedPrefixHistogram", "DPDirectPrefixSynthesis",
              "Synthesize", "YamlHistogram", "YamlMarginals", "YamlCount", "YamlPrefixes"}


def test_display_data_is_public_parameters_only(tmp_path):
    instances = _factories(tmp_path)
    # every public transform outside the public API and the pending list is checked here
    expected = {n for n, c in _public_transform_classes().items()
                if c.__module__ not in API_MODULES and c.__name__ not in PENDING}
    assert {f"{type(t).__module__}.{type(t).__name__}" for t in instances.values()} == expected
    for name, transform in instances.items():
        data = DisplayData.create_from(transform)
        assert len(data.to_proto()) == len(data.items) > 0, name  # what runners receive
        values = {i.key: i.value for i in data.items}
        assert "mechanism" in values or "step" in values, name
        if name in MECHANISMS:
            assert "epsilon" in values or "epsilon_per_window" in values, name
            assert "mechanism" in values, name
        for key, value in values.items():
            assert isinstance(value, (str, int, float, bool)), (name, key, value)
            assert SENTINEL not in str(value), (name, key)  # declared labels are not shown
        secret = getattr(transform, "_seed", None)
        if secret is not None:  # secure mode: the run secret never reaches the job graph
            assert all(str(secret) not in str(v) for v in values.values()), name


def test_mechanism_display_values():
    marginals = DPMarginals(specs=[(0,), (1, 2)], shape=SCHEMA.shape, names=SCHEMA.names,
                            budgets=[PureDP(epsilon=0.25), PureDP(epsilon=0.75)])
    values = {k: v.value if isinstance(v, DisplayDataItem) else v
              for k, v in marginals.display_data().items()}
    s = SCHEMA.shape
    assert values["epsilon"] == 1.0 and values["delta"] == 0.0
    assert values["declared_cells"] == s[0] + s[1] * s[2]
    assert values["noise_scale"] == "1.33333 to 4"  # k/ε of each table
    count = {k: v.value for k, v in DPCount(budget=PureDP(epsilon=0.5)).display_data().items()}
    assert count["noise_scale"] == 2.0 and count["sensitivity"] == 1


# generic steps whose elements are whatever the caller's are (no element type to declare)
UNTYPED = {
    "Synthesize": "Beam YAML step: schema'd rows of any schema in, rows of the step's schema out",
    **dict.fromkeys(("Histogram", "Marginals", "Count", "Prefixes"),  # pipelines/yaml_stats.py (API's: typed)
                    "Beam YAML step: schema'd rows of any schema in, released rows out"),
    "Heartbeats": "emits Beam-timestamped heartbeats for any windowed input",
    "DropOutsideDeclared": "passes any element through",
    "CombineDeclaredWindows": "combines any element with any CombineFn",
    "SplitLate": "passes any element through",
}


def test_every_public_ptransform_declares_its_element_types():
    missing = sorted(
        name for name, cls in _public_transform_classes().items()
        if cls.__module__ not in API_MODULES and cls.__name__ not in UNTYPED
        and not getattr(cls, "declared_element_types", None))
    assert missing == []
