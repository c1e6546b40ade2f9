"""Runner presets: ``--runner NAME`` expands to a validated, documented set of Beam options.

A preset is a named bundle of Beam pipeline options plus the options a user must supply
(``required``). :func:`options_for` is what the CLI calls on the arguments it did not consume:

* ``--runner direct`` (also the default without ``--runner``): the in-process DirectRunner (one
  process; the reference for seeded runs), as :class:`~beamsynth.runners.local.LocalDirectRunner`,
  which never switches to Beam's Prism runner (nor tries to download it).
* ``--runner direct-multi``: the DirectRunner in ``multi_processing`` mode, 2 workers by default
  (``--direct_num_workers`` overrides).
* ``--runner dask``: Beam's DaskRunner on a dask.distributed cluster. Without
  ``--dask_client_address`` the runner starts a ``LocalCluster``; see ``docs/runners.md`` for
  what the DaskRunner of apache-beam 2.77 gets wrong and how beamsynth works around it.
* ``--runner flink`` / ``--runner spark``: the portable runner against a running Flink or Spark
  job server (``--job_endpoint`` required, e.g. ``localhost:8099``).
* ``--runner dataflow``: Google Cloud Dataflow (``--project``, ``--region``,
  ``--temp_location`` required).

Flink, Spark and Dataflow option sets are validated and documented but were **not run** on the
development machine (their job servers cannot be downloaded there). Plain Beam runner names
(``DirectRunner``, ``PortableRunner``, a dotted class path, ...) pass through unchanged.
User-given options always win over a preset's defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beamsynth.runners.local import LOCAL_DIRECT_RUNNER

__all__ = [
    "DASK_RUNNER",
    "PRESETS",
    "Preset",
    "PresetError",
    "is_dask",
    "options_for",
    "preset_names",
]

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
DEFAULT_PRESET = "direct"  # without --runner (LocalDirectRunner: the DirectRunner minus Prism)


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
        Preset("direct", LOCAL_DIRECT_RUNNER, {"direct_running_mode": "in_memory"},
               description="in-process DirectRunner (single process; reference for seeded runs)",
               tested_here=True),
        Preset("direct-multi", LOCAL_DIRECT_RUNNER,
               {"direct_running_mode": "multi_processing", "direct_num_workers": 2},
               description="DirectRunner with worker processes (2 by default)", tested_here=True),
        Preset("dask", DASK_RUNNER, {},
               description="Beam's DaskRunner on dask.distributed (LocalCluster unless "
                           "--dask_client_address is given)", tested_here=True),
        Preset("flink", "PortableRunner", {"environment_type": "LOOPBACK"},
               required=("job_endpoint",),
               description="portable runner against a Flink job server (--job_endpoint host:port)"),
        Preset("spark", "PortableRunner", {"environment_type": "LOOPBACK"},
               required=("job_endpoint",),
               description="portable runner against a Spark job server (--job_endpoint host:port)"),
        Preset("dataflow", "DataflowRunner", {},
               required=("project", "region", "temp_location"),
               description="Google Cloud Dataflow (needs apache-beam[gcp] and credentials)"),
    )
}

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
        out = list(beam_args)
        _check_values(out)
        return out
    preset = PRESETS[runner]
    preset.validate(rest)
    out = preset.args(rest) + rest
    _check_values(out)
    return out


def options_for(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam ``PipelineOptions`` for CLI arguments, expanding a runner preset.

    Args:
      beam_args: the arguments the beamsynth CLI did not consume, e.g.
        ``["--runner", "direct-multi", "--direct_num_workers=4"]``.

    Raises:
      PresetError: a preset's required option is missing or a value is out of range.
    """
    return PipelineOptions(expand_args(beam_args))


def is_dask(options: PipelineOptions | None) -> bool:
    """Whether ``options`` select Beam's DaskRunner (which needs the Dask-safe graph shapes)."""
    if options is None:
        return False
    runner = options.view_as(StandardOptions).runner
    if runner is None:
        return False
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.split(".")[-1] == "DaskRunner"
