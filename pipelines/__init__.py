"""End-to-end pipelines, file I/O, releases and the ``beamsynth`` command line.

Subpackages, bottom to top (each imports only those before it; ``tests/unit/test_layering.py``):

* :mod:`beamsynth.pipelines.io`: files in and out: one reader per format, split planning,
  encoding to declared cells, dead letters, table writers, single-file output, manifests and the
  whole-file checks before a run;
* :mod:`beamsynth.pipelines.methods`: what a command computes: the synthesis method registry and
  method wiring (independent, PrivBayes, SBHG, plausible deniability), the ``synthesize``,
  ``histogram`` and ``prefixes`` pipelines;
* :mod:`beamsynth.pipelines.releases`: declarative releases (config, plan, run, publish), the
  privacy ledger, reports and quality metrics;
* :mod:`beamsynth.pipelines.cli`: the ``beamsynth`` command (one module per subcommand).

Modules at this level, on top of ``io`` and ``methods``: :mod:`~beamsynth.pipelines.job` (the
public API's ``Synthesize`` composites and ``WriteManifest``), :mod:`~beamsynth.pipelines.stream`
(windowed releases), :mod:`~beamsynth.pipelines.yaml_transforms` (the Beam YAML step, provider
``beamsynth_provider.yaml``, example ``synthesize_adult.yaml``), :mod:`~beamsynth.pipelines.yaml_stats`
(the Beam YAML DP statistics steps) and
:mod:`~beamsynth.pipelines.schema_draft` (schemas drafted from a data dictionary).

The public surface is ``import beamsynth as bs``; everything here is internal.
"""
