"""Runner presets: ``--runner NAME`` expands to a validated, documented set of Beam options.

A preset is a named bundle of Beam pipeline options plus the options a user must supply
(``required``). :func:`options_for` is what the CLI calls on the arguments it did not consume:

* ``--runner direct`` (also the default without ``--runner``): the in-process DirectRunner (one
  process; the reference for seeded runs), as :class:`~beamsynth.runners.local.LocalDirectRunner`,
  which never switches to Beam's Prism runner (nor tries to download it).
* ``--runner direct-multi``: the DirectRunner in ``multi_processing`` mode, 2 workers by default
  (``--direct_num_workers`` overrides). Both direct presets set the SDK workers' log level to
  WARNING (:data:`QUIET_WORKERS`) unless ``--default_sdk_harness_log_level`` is given;
  ``direct-multi`` also mutes the workers' duplicate option-parsing warnings
  (:data:`QUIET_WORKER_STARTUP`) unless ``--sdk_harness_log_level_overrides`` is given.
* ``--runner dask`` (or ``--runner DaskRunner``): :class:`beamsynth.runners.dask_runner.DaskRunner`,
  Beam's DaskRunner with its translation gaps closed (every sink runs, multi-output ParDos,
  ``finish_bundle`` output, side inputs computed once, metrics, windows), on a dask.distributed
  cluster. Without ``--dask_client_address`` the runner starts a ``LocalCluster``; see
  ``docs/runners.md``. Beam's own runner stays reachable by its dotted path. dask.distributed
  logs at the workers' level (WARNING unless ``--default_sdk_harness_log_level`` is given, or
  ``DASK_LOGGING__DISTRIBUTED`` is set).
* ``--runner flink``: Beam's ``FlinkRunner`` (``--flink_master host:port`` required,
  ``--flink_version`` one of :func:`flink_versions`, read from Beam's
  ``FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS``); ``--runner spark``: Beam's ``SparkRunner``
  (``--spark_master_url`` required, ``--spark_version`` one of :func:`spark_versions`). Given
  ``--job_endpoint`` instead of the master, either becomes its ``-portable`` preset: the
  portable runner against a running job server (image :func:`job_server_image`).
* ``--runner dataflow``: Google Cloud Dataflow (``--project``, ``--region``,
  ``--temp_location`` required).

Flink, Spark and Dataflow option sets are validated and documented but were **not run** on the
development machine (their job servers cannot be downloaded there). Plain Beam runner names
(``DirectRunner``, ``PortableRunner``, a dotted class path, ...) pass through unchanged.
User-given options always win over a preset's defaults.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beamsynth.runners.local import LOCAL_DIRECT_RUNNER
from beamsynth.runners.options import suggest_flag

__all__ = [
    "BEAM_DASK_RUNNER",
    "DASK_RUNNER",
    "flink_versions",
    "job_server_image",
    "spark_versions",
    "versions_markdown",
    "VERSIONS_BEGIN",
    "VERSIONS_END",
    "PRESETS",
    "Preset",
    "PresetError",
    "QUIET_WORKERS",
    "QUIET_WORKER_STARTUP",
    "is_beam_dask",
    "is_dask",
    "options_for",
    "preset_names",
]

DASK_RUNNER = "beamsynth.runners.dask_runner.DaskRunner"  # Beam's DaskRunner, gaps closed
BEAM_DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"  # Beam's own (gaps: docs)
DEFAULT_PRESET = "direct"  # without --runner (LocalDirectRunner: the DirectRunner minus Prism)
# Local SDK workers log at WARNING (their INFO lines, one set per bundle and worker, buried the
# CLI's progress on direct-multi); --default_sdk_harness_log_level=INFO (or the CLI's --verbose)
# brings them back.
QUIET_WORKERS = {"default_sdk_harness_log_level": "WARNING"}
# Each direct-multi worker re-parses the launcher's options and warns "Discarding unparseable
# args: ['--direct_runner_use_stacked_bundle', '--pipeline_type_check']" on every run, relayed to
# the launcher, which prints it again: Beam's PipelineOptions.from_dictionary turns the True
# default of a --no_X flag (dest X) into --X, which no parser knows. The launcher parsed the same
# options (and warned about, or with bs.check_pipeline_args refused, any it did not know), so only
# that logger, only in the workers, goes to ERROR. Not muted: the workers' "No
# semi_persistent_directory found" (logger __main__ there, the name a user script's own
# logging.getLogger(__name__) gets in a worker too) and the per-process import warnings.
QUIET_WORKER_STARTUP = {"sdk_harness_log_level_overrides": json.dumps(
    {"apache_beam.options.pipeline_options": "ERROR"}, separators=(",", ":"))}
DASK_LOG_VARIABLE = "DASK_LOGGING__DISTRIBUTED"  # dask.distributed's log level (its config)
_dask_level_set: list[str] = []  # the value this module put in DASK_LOG_VARIABLE, if any


class PresetError(ValueError):
    """A preset is missing a required option or got an invalid value."""


@dataclass(frozen=True)
class Preset:
    """A named runner configuration.

    Attributes:
      name: what follows ``--runner``.
      runner: the Beam runner (name or dotted class path) the preset selects.
      defaults: option name (without ``--``) → value, applied unless the user gives the option.
      required: options the user must give (e.g. ``project`` for Dataflow).
      description: one line for ``--help`` and the docs.
      tested_here: whether the preset was run on the development machine.
    """

    name: str
    runner: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    description: str = ""
    tested_here: bool = False

    def args(self, given: Sequence[str]) -> list[str]:
        """The preset's options as argv, skipping every option already in ``given``."""
        have = _option_names(given)
        out = [f"--runner={self.runner}"]
        for key, value in self.defaults.items():
            if key in have:
                continue
            if value is False or value is None:
                continue
            if value is True:
                out.append(f"--{key}")
            else:
                out.append(f"--{key}={value}")
        return out

    def validate(self, argv: Sequence[str]) -> None:
        """Raise :class:`PresetError` naming every missing required option."""
        have = _option_names(argv)
        missing = [r for r in self.required if r not in have]
        if missing:
            flags = ", ".join(f"--{m}" for m in missing)
            raise PresetError(f"runner preset {self.name!r} needs {flags} (missing: {missing})")


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("direct", LOCAL_DIRECT_RUNNER,
               {"direct_running_mode": "in_memory", **QUIET_WORKERS},
               description="in-process DirectRunner (single process; reference for seeded runs)",
               tested_here=True),
        Preset("direct-multi", LOCAL_DIRECT_RUNNER,
               {"direct_running_mode": "multi_processing", "direct_num_workers": 2, **QUIET_WORKERS,
                **QUIET_WORKER_STARTUP},
               description="DirectRunner with worker processes (2 by default)", tested_here=True),
        Preset("dask", DASK_RUNNER, dict(QUIET_WORKERS),
               description="Beam's DaskRunner with its gaps closed "
                           "(beamsynth.runners.dask_runner) on dask.distributed (LocalCluster "
                           "unless --dask_client_address is given)", tested_here=True),
        Preset("flink", "FlinkRunner", {},
               required=("flink_master",),
               description="Beam's FlinkRunner against a Flink cluster (--flink_master host:port; "
                           "--flink_version one of Beam's published versions); with "
                           "--job_endpoint instead: the flink-portable preset"),
        Preset("flink-portable", "PortableRunner", {"environment_type": "LOOPBACK"},
               required=("job_endpoint",),
               description="portable runner against a running Flink job server "
                           "(--job_endpoint host:port)"),
        Preset("spark", "SparkRunner", {},
               required=("spark_master_url",),
               description="Beam's SparkRunner against a Spark master (--spark_master_url "
                           "spark://host:port or local[N]); with --job_endpoint instead: the "
                           "spark-portable preset"),
        Preset("spark-portable", "PortableRunner", {"environment_type": "LOOPBACK"},
               required=("job_endpoint",),
               description="portable runner against a running Spark job server "
                           "(--job_endpoint host:port)"),
        Preset("dataflow", "DataflowRunner", {},
               required=("project", "region", "temp_location"),
               description="Google Cloud Dataflow (needs apache-beam[gcp] and credentials)"),
    )
}

# Presets a --job_endpoint (without the master option) turns into their portable form.
_PORTABLE_FORMS = {"flink": ("flink_master", "flink-portable"),
                   "spark": ("spark_master_url", "spark-portable")}
_FLINK_MASTER = re.compile(r"^(\[local\]|\[auto\]|(https?://)?[A-Za-z0-9_.\-]+:\d{1,5})$")
_SPARK_MASTER = re.compile(r"^(local(\[(\d+|\*)\])?|spark://[A-Za-z0-9_.\-]+:\d{1,5}"
                           r"(,[A-Za-z0-9_.\-]+:\d{1,5})*|yarn|k8s://\S+)$")


def _choices(options_cls: type, dest: str) -> list[str]:
    """The ``choices`` Beam declares for an option of ``options_cls`` (read from its parser)."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    options_cls._add_argparse_args(parser)
    for action in parser._actions:
        if action.dest == dest:
            return [str(c) for c in action.choices or ()]
    raise LookupError(f"{options_cls.__name__} has no option {dest!r} in this apache-beam")


def flink_versions() -> list[str]:
    """Flink versions this apache-beam publishes a runner and job server for (Beam's own list,
    ``FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS``; the last is Beam's default)."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions

    return [str(v) for v in FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS]


def spark_versions() -> list[str]:
    """Spark major versions this apache-beam accepts for ``--spark_version`` (its choices)."""
    from apache_beam.options.pipeline_options import SparkRunnerOptions

    return _choices(SparkRunnerOptions, "spark_version")


def job_server_image(engine: str, version: str) -> str:
    """Docker image of Beam's job server for ``engine`` (``flink``/``spark``) ``version``, tagged
    with the installed apache-beam version, e.g. ``apache/beam_flink2.2_job_server:2.77.0``."""
    import apache_beam

    allowed = {"flink": flink_versions, "spark": spark_versions}
    if engine not in allowed:
        raise ValueError(f"engine ({engine!r}) must be one of {sorted(allowed)}")
    if version not in allowed[engine]():
        raise ValueError(f"{engine} version ({version!r}) must be one of {allowed[engine]()} "
                         f"(apache-beam {apache_beam.__version__})")
    return f"apache/beam_{engine}{version}_job_server:{apache_beam.__version__}"


VERSIONS_BEGIN = "<!-- begin: versions generated from apache_beam by runners/presets.py -->"
VERSIONS_END = "<!-- end: versions -->"


def versions_markdown() -> str:
    """The Flink/Spark version table of ``docs/runners.md``, generated from the installed Beam."""
    import apache_beam

    flink = flink_versions()
    lines = [f"apache-beam {apache_beam.__version__}: `--flink_version` "
             + ", ".join(f"`{v}`" for v in flink) + f" (default `{flink[-1]}`); `--spark_version` "
             + ", ".join(f"`{v}`" for v in spark_versions()) + ".", "",
             "| engine | version | job server image |", "| --- | --- | --- |"]
    lines += [f"| Flink | {v} | `{job_server_image('flink', v)}` |" for v in flink]
    lines += [f"| Spark | {v} | `{job_server_image('spark', v)}` |" for v in spark_versions()]
    return "\n".join(lines)


# Options whose value must parse as an int >= 1.
_POSITIVE_INTS = ("direct_num_workers", "num_workers", "max_num_workers", "dask_npartitions")


def preset_names() -> list[str]:
    """Names accepted by ``--runner`` besides plain Beam runner names."""
    return sorted(PRESETS)


def _option_names(argv: Sequence[str]) -> dict[str, str | None]:
    """``{name: value}`` of every ``--name[=value]`` / ``--name value`` in ``argv``."""
    out: dict[str, str | None] = {}
    i = 0
    argv = list(argv)
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            body = arg[2:]
            if "=" in body:
                name, value = body.split("=", 1)
                out[name.replace("-", "_")] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[body.replace("-", "_")] = argv[i + 1]
                i += 1
            else:
                out[body.replace("-", "_")] = None
        i += 1
    return out


def _split_runner(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(value of ``--runner``, argv without it)."""
    rest: list[str] = []
    runner = None
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--runner="):
            runner = arg.split("=", 1)[1]
        elif arg == "--runner":
            if i + 1 >= len(argv):
                raise PresetError("--runner needs a value: a preset "
                                  f"{preset_names()} or a Beam runner name")
            runner = argv[i + 1]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return runner, rest


def _check_values(argv: Sequence[str]) -> None:
    opts = _option_names(argv)
    for name in _POSITIVE_INTS:
        if name in opts:
            raw = opts[name]
            try:
                value = int(raw) if raw is not None else None
            except ValueError:
                value = None
            if value is None or value < 1:
                raise PresetError(f"--{name} ({raw!r}) must be an int >= 1")
    mode = opts.get("direct_running_mode")
    if "direct_running_mode" in opts and mode not in ("in_memory", "multi_threading", "multi_processing"):
        raise PresetError(f"--direct_running_mode ({mode!r}) must be one of "
                          "in_memory, multi_threading, multi_processing")
    for name, allowed in (("flink_version", flink_versions), ("spark_version", spark_versions)):
        if name in opts and opts[name] not in allowed():
            raise PresetError(f"--{name} ({opts[name]!r}) is not published for this apache-beam; "
                              f"supported: {', '.join(allowed())}")
    master = opts.get("flink_master")
    if "flink_master" in opts and (master is None or not _FLINK_MASTER.match(master)):
        raise PresetError(f"--flink_master ({master!r}) must be host:port, http(s)://host:port, "
                          "[local] or [auto]")
    master = opts.get("spark_master_url")
    if "spark_master_url" in opts and (master is None or not _SPARK_MASTER.match(master)):
        raise PresetError(f"--spark_master_url ({master!r}) must be spark://host:port, local, "
                          "local[N], local[*], yarn or k8s://...")
    temp = opts.get("temp_location")
    if temp is not None and opts.get("runner") == "DataflowRunner" and not temp.startswith("gs://"):
        raise PresetError(f"--temp_location ({temp!r}) must be a gs:// path for Dataflow")


def expand_args(beam_args: Sequence[str]) -> list[str]:
    """``beam_args`` with a preset ``--runner NAME`` replaced by the preset's options.

    User-given options come last so they win over the preset's defaults.
    """
    runner, rest = _split_runner(beam_args)
    if runner == "DaskRunner":  # Beam only knows the DaskRunner by its dotted path
        runner = "dask"
    if runner is None:  # no --runner: the direct preset (Beam's default runner, minus Prism)
        runner = DEFAULT_PRESET
    if runner is None or runner not in PRESETS:
        _check_beam_runner(runner)
        out = list(beam_args)
        _check_values(out)
        return out
    if runner in _PORTABLE_FORMS:
        master, portable = _PORTABLE_FORMS[runner]
        given = _option_names(rest)
        if "job_endpoint" in given and master in given:
            raise PresetError(f"runner preset {runner!r}: give --{master} (Beam's {runner} runner) "
                              "or --job_endpoint (a running job server), not both")
        if "job_endpoint" in given:
            runner = portable
    preset = PRESETS[runner]
    preset.validate(rest)
    out = preset.args(rest) + rest
    _check_values(out)
    return out


def _check_beam_runner(runner: str | None) -> None:
    """A ``--runner`` that is no preset must be a name Beam resolves (as ``create_runner`` does:
    a known runner, with or without ``Runner``, any case, or a dotted class path); else
    ``PresetError`` naming the closest preset (``direct_multi`` → ``direct-multi``)."""
    if runner is None or "." in runner:
        return
    known = {p.rsplit(".", 1)[-1].lower() for p in StandardOptions.ALL_KNOWN_RUNNERS}
    if runner.lower() in known or f"{runner.lower()}runner" in known:
        return
    hint = suggest_flag(runner.lower(), list(PRESETS))
    raise PresetError(f"--runner {runner}: no such preset or Beam runner"
                      + (f" (did you mean {hint}?)" if hint else "")
                      + f"; presets: {', '.join(PRESETS)}; Beam's runners by class name "
                      "(DirectRunner, FlinkRunner, ...) or a dotted class path (docs/runners.md)")


def options_for(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam ``PipelineOptions`` for CLI arguments, expanding a runner preset.

    Args:
      beam_args: the arguments the beamsynth CLI did not consume, e.g.
        ``["--runner", "direct-multi", "--direct_num_workers=4"]``.

    Raises:
      PresetError: a preset's required option is missing or a value is out of range.
      TypeError: ``beam_args`` is one string (Beam would split it into characters and silently
        run on the default runner) or holds something other than strings.
    """
    if isinstance(beam_args, (str, bytes)):
        raise TypeError(f"pipeline options take a list of arguments, e.g. "
                        f"['--runner', 'direct-multi'], not the string {beam_args!r}")
    bad = [a for a in beam_args if not isinstance(a, str)]
    if bad:
        raise TypeError(f"pipeline options must be strings; got {bad[0]!r}")
    argv = expand_args(beam_args)
    if _option_names(argv).get("runner") == DASK_RUNNER:
        _dask_log_level(argv)
    if any(a.startswith("--dask_") for a in argv):
        try:  # registers Beam's DaskOptions, so --dask_* options parse without a warning
            import apache_beam.runners.dask.dask_runner  # noqa: F401
        except ImportError:  # dask not installed: the runner says so when it starts
            pass
    return PipelineOptions(argv)


def _dask_log_level(argv: Sequence[str]) -> None:
    """Beam's DaskOptions have no log level: the preset's worker level
    (``--default_sdk_harness_log_level``, WARNING unless given) becomes dask.distributed's, so the
    LocalCluster's scheduler, nannies and workers do not print ~70 INFO lines per run. Set through
    dask's config variable (read by every process it starts) unless the user set it."""
    level = _option_names(argv).get("default_sdk_harness_log_level")
    if not level or os.environ.get(DASK_LOG_VARIABLE, "") not in ("", *_dask_level_set[-1:]):
        return  # no level, or the user's own setting
    name = logging.getLevelName(int(level)) if level.isdigit() else level.upper()
    os.environ[DASK_LOG_VARIABLE] = name.lower()
    _dask_level_set.append(name.lower())
    if "distributed" in sys.modules:  # imported already: its loggers read the config at import
        logging.getLogger("distributed").setLevel(name)


def is_dask(options: PipelineOptions | None) -> bool:
    """Whether ``options`` select Beam's DaskRunner (which needs the Dask-safe graph shapes)."""
    if options is None:
        return False
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        return False
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.split(".")[-1] == "DaskRunner"


def is_beam_dask(options: PipelineOptions | None) -> bool:
    """Whether ``options`` select Beam's own DaskRunner, whose gaps (docs/runners.md) mean only
    the last-applied sink runs: callers then join their sinks into one last step."""
    if not is_dask(options):
        return False
    runner = options.view_as(StandardOptions).runner  # type: ignore[union-attr]
    if isinstance(runner, str):
        return runner in (BEAM_DASK_RUNNER, "DaskRunner")
    from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner

    return isinstance(runner, BeamDaskRunner)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m beamsynth.runners.presets --versions``: print the docs' version block."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["--versions"]:
        print("usage: python -m beamsynth.runners.presets --versions", file=sys.stderr)
        return 2
    print(f"{VERSIONS_BEGIN}\n{versions_markdown()}\n{VERSIONS_END}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
