"""The ``beamsynth`` command line: argument parsing, pre-flight and console output only.

* :mod:`~beamsynth.pipelines.cli.main`: the entry point (``main``; console script ``beamsynth``,
  ``python -m beamsynth.pipelines.cli.main``); subcommand modules are listed in
  ``_COMMAND_MODULES``, each exposing ``add_parser(sub)`` and setting ``func(args, beam_args)``;
* one module per command: :mod:`~beamsynth.pipelines.cli.synthesize` (also ``pipeline_options``,
  the Beam options of every command), :mod:`~beamsynth.pipelines.cli.schema`,
  :mod:`~beamsynth.pipelines.cli.histogram`, :mod:`~beamsynth.pipelines.cli.prefixes`,
  :mod:`~beamsynth.pipelines.cli.release` (``release``, ``ledger``, ``report``);
* :mod:`~beamsynth.pipelines.cli.console`: the input-check options every command shares
  (``--allow-empty``, ``--warn-rejected``, ``--fail-on-rejected``) and what goes to the operator's
  console after a run (honest counts, the rejected-rows warning, method advice).

The pipelines themselves live in :mod:`beamsynth.pipelines.methods` and
:mod:`beamsynth.pipelines.releases`; nothing below this package imports it.
"""
