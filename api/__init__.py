"""beamsynth: differentially private synthesis and statistics as Apache Beam transforms.

``import beamsynth as bs`` is the public surface (docs/beam-api.md, "Use it in your Beam job")::

    job = bs.PrivacyJob(epsilon=1.0, privacy_unit=bs.PrivacyUnit(id_column="user_id",
                                                                 max_contributions=3))
    private = records | job.private(bs.load_schema("adult"))
    private.dead_letters | "WriteBad" >> beam.io.WriteToText("bad")   # element, reason, position
    counts = private | bs.Count(epsilon=0.05)
    tables = private | bs.Marginals(marginals=[("age", "sex")], epsilon=0.2)
    synthetic = private | bs.PrivBayes(epsilon=0.7, rows=10_000)
    _ = p | bs.WriteManifest(job=job, path="out/manifest.json")
    # output="json": its text for beam.io.WriteToText; output="row": a schema'd Row for
    # WriteToJson/WriteToCsv/WriteToParquet (default: the manifest as a dict)

Every mechanism spends its ε on the job's one accountant when it is applied, before any data is
read; overspending raises :class:`BudgetExceededError` while the pipeline is built.

Per declared window: ``job.private(schema, windows=bs.DeclaredWindows(start=, end=, size=))``
(one release per declared window, rows carry ``window_start``). Pipeline options:
``bs.pipeline_options(argv)`` (runner presets ``--runner direct|direct-multi|dask|...``),
``bs.BeamsynthOptions`` (``--beamsynth_epsilon``, ...), ``bs.privacy_job_from_options``, and
``bs.check_pipeline_args`` (raises ``bs.UnknownOptionError`` for a mistyped flag, with a
suggestion). A job needs nothing but ``bs.`` names and Apache Beam; everything else
(``beamsynth.transforms``, ``beamsynth.pipelines``, ``beamsynth.runners``, ...) is internal.
"""

from beamsynth import (
    _beam_import,  # noqa: F401  (first: Beam without its import warning)
    _csv_header_fix,  # noqa: F401  (Beam's ReadFromCsv endless on a 0-byte file)
    _json_sample_fix,  # noqa: F401  (Beam's ReadFromJson fails when built on no records)
    _row_by_name_fix,  # noqa: F401  (Beam's DataFrame reads zip columns by position)
)
from beamsynth.pipelines.job import (
    SBHG,
    IndependentSynthesis,
    PlausibleDeniability,
    PrivBayes,
    Synthesize,
    WriteManifest,
)
from beamsynth.runners.options import (
    BeamsynthOptions,
    UnknownOptionError,
    beamsynth_settings,
    check_pipeline_args,
    privacy_job_from_options,
)
from beamsynth.runners.presets import PresetError
from beamsynth.runners.presets import options_for as pipeline_options
from beamsynth.schemas.keys import HierarchyKeyCodec as HierarchyKey
from beamsynth.schemas.keys import SpatialKeyCodec as SpatialKey
from beamsynth.schemas.keys import TextKeyCodec as TextKey
from beamsynth.schemas.schema import EncodedBatch, Schema, SchemaError, load_schema
from beamsynth.schemas.schema import avro_field_name as field_name
from beamsynth.transforms.budget import ApproxDP, BudgetExceededError, PureDP
from beamsynth.transforms.cathist import ReleasedHistogram
from beamsynth.transforms.inputs import DEAD_LETTER_TYPE
from beamsynth.transforms.measure import NoisyMarginal
from beamsynth.transforms.outputs import arrow_schema
from beamsynth.transforms.private import MakePrivate, PrivacyJob, PrivacyUnit, PrivateCollection
from beamsynth.transforms.private_ops import Count, Histogram, Marginals, PrefixTree
from beamsynth.transforms.synthesis import NoisyCount, SynthesisModel
from beamsynth.transforms.windows import DeclaredWindows

__all__ = [
    "DEAD_LETTER_TYPE",
    "SBHG",
    "ApproxDP",
    "BeamsynthOptions",
    "BudgetExceededError",
    "Count",
    "DeclaredWindows",
    "EncodedBatch",
    "HierarchyKey",
    "Histogram",
    "IndependentSynthesis",
    "MakePrivate",
    "Marginals",
    "NoisyCount",
    "NoisyMarginal",
    "PlausibleDeniability",
    "PrefixTree",
    "PresetError",
    "PrivBayes",
    "PrivacyJob",
    "PrivacyUnit",
    "PrivateCollection",
    "PureDP",
    "ReleasedHistogram",
    "Schema",
    "SchemaError",
    "SpatialKey",
    "Synthesize",
    "SynthesisModel",
    "TextKey",
    "UnknownOptionError",
    "WriteManifest",
    "arrow_schema",
    "beamsynth_settings",
    "check_pipeline_args",
    "field_name",
    "load_schema",
    "pipeline_options",
    "privacy_job_from_options",
]
