"""beamsynth's Beam pipeline options, and the check that every forwarded option is one Beam knows.

:class:`BeamsynthOptions` is a ``PipelineOptions`` subclass, so a Beam job that uses beamsynth's
transforms from Python takes beamsynth's settings the way it takes any other Beam option
(command line, ``PipelineOptions(flags)``, templates)::

    options = PipelineOptions(["--beamsynth_epsilon=1", "--beamsynth_manifest=gs://b/m.json"])
    settings = beamsynth_settings(options)   # validated; settings.epsilon == 1.0
    job = privacy_job_from_options(options)  # the job's one budget (bs.PrivacyJob), ε = 1

========================  =========================================================================
option                    meaning
========================  =========================================================================
--beamsynth_epsilon E     total ε of the job (> 0): the one budget every beamsynth transform of the
                          pipeline draws from; overspending fails while the pipeline is built
--beamsynth_delta D       total δ of the job (in [0, 1), default 0)
--beamsynth_seed N        fixed seed (int ≥ 0) for tests and demos only: outputs and the manifest
                          are marked "seeded: not for release"; without it privacy randomness is
                          secure (a per-run secret from OS entropy)
--beamsynth_manifest P    where the job's manifest (every spend; public and private parts) is
                          written, any Beam path (local, gs://, s3://...)
========================  =========================================================================

The ``beamsynth`` CLI has its own flags for these (``--epsilon``, ``--delta``, ``--seed``,
the manifest goes next to ``--output``) and refuses the ``--beamsynth_*`` forms, so
one setting never has two spellings on one command line.

:func:`check_pipeline_args` is what the CLI runs on the arguments it did not consume before
anything is read or spent: each must parse as an option of a registered ``PipelineOptions``
subclass (exactly Beam's own parser of ``PipelineOptions.get_all_options``, which otherwise drops
unknown options with only a log line), else it raises :class:`UnknownOptionError` with a
"did you mean" suggestion drawn from the subcommand's flags and Beam's.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

__all__ = [
    "CLI_EQUIVALENTS",
    "BeamsynthOptions",
    "BeamsynthSettings",
    "UnknownOptionError",
    "beam_option_flags",
    "beamsynth_settings",
    "check_pipeline_args",
    "privacy_job_from_options",
    "suggest_flag",
]

# Modules whose import registers the PipelineOptions of a runner a preset selects
# (runners/presets.py); optional extras that are not installed are skipped.
_OPTION_MODULES = ("apache_beam.runners.dask.dask_runner",)

# --beamsynth_* option -> what the beamsynth CLI takes instead
CLI_EQUIVALENTS = {
    "beamsynth_epsilon": "--epsilon",
    "beamsynth_delta": "--delta",
    "beamsynth_seed": "--seed",
    "beamsynth_manifest": "--output (the manifest is written to OUTPUT.manifest.json)",
}


class BeamsynthOptions(PipelineOptions):
    """beamsynth's settings as Beam pipeline options (see the module docstring for the table)."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("beamsynth")
        group.add_argument("--beamsynth_epsilon", type=float, default=None,
                           help="total ε of the job's one privacy budget (> 0)")
        group.add_argument("--beamsynth_delta", type=float, default=None,
                           help="total δ of the job's budget (in [0, 1); default 0)")
        group.add_argument("--beamsynth_seed", type=int, default=None,
                           help="fixed seed for tests and demos: outputs are marked 'seeded: not "
                                "for release' (default: secure randomness)")
        group.add_argument("--beamsynth_manifest", default=None,
                           help="path (any Beam filesystem) of the job's privacy manifest")


@dataclass(frozen=True)
class BeamsynthSettings:
    """Validated :class:`BeamsynthOptions` values.

    Attributes:
      epsilon: total ε of the job, or ``None`` when not given as an option.
      delta: total δ (0 when not given).
      seed: fixed seed (tests/demos only) or ``None`` for secure randomness.
      manifest: where the manifest is written, or ``None``.
    """

    epsilon: float | None
    delta: float
    seed: int | None
    manifest: str | None

    @property
    def seeded(self) -> bool:
        """Whether outputs must be marked 'seeded: not for release'."""
        return self.seed is not None


def beamsynth_settings(options: PipelineOptions | None) -> BeamsynthSettings:
    """The validated beamsynth settings of ``options`` (defaults when ``options`` is None).

    Raises:
      ValueError: ε not a finite number > 0, δ outside [0, 1), a negative seed, or an empty
        manifest path; the message echoes the value given.
    """
    view = (options or PipelineOptions([])).view_as(BeamsynthOptions)
    epsilon, delta, seed = view.beamsynth_epsilon, view.beamsynth_delta, view.beamsynth_seed
    manifest = view.beamsynth_manifest
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"--beamsynth_epsilon ({epsilon!r}) must be a finite number > 0")
    if delta is not None and not (math.isfinite(delta) and 0 <= delta < 1):
        raise ValueError(f"--beamsynth_delta ({delta!r}) must be in [0, 1)")
    if seed is not None and seed < 0:
        raise ValueError(f"--beamsynth_seed ({seed!r}) must be an int >= 0")
    if manifest is not None and not str(manifest).strip():
        raise ValueError(f"--beamsynth_manifest ({manifest!r}) must be a non-empty path")
    return BeamsynthSettings(epsilon=epsilon, delta=0.0 if delta is None else float(delta),
                             seed=seed, manifest=manifest)


def privacy_job_from_options(options: PipelineOptions, **kwargs: Any) -> Any:
    """The job's one :class:`~beamsynth.transforms.private.PrivacyJob` from its pipeline options:
    ε and δ from ``--beamsynth_epsilon``/``--beamsynth_delta``, the seed from
    ``--beamsynth_seed`` (secure when absent). ``kwargs`` go to ``PrivacyJob`` (``privacy_unit``,
    ``name``). Write the manifest with ``bs.WriteManifest(job=job, path=settings.manifest)``.

    Raises:
      ValueError: ``--beamsynth_epsilon`` is missing (a budget is never defaulted) or any
        beamsynth option is out of range (:func:`beamsynth_settings`).
    """
    from beamsynth.transforms.private import PrivacyJob

    settings = beamsynth_settings(options)
    if settings.epsilon is None:
        raise ValueError("--beamsynth_epsilon is required: the job's total ε has no default")
    return PrivacyJob(epsilon=settings.epsilon, delta=settings.delta, seed=settings.seed, **kwargs)


class UnknownOptionError(ValueError):
    """A command-line option that neither beamsynth nor any registered Beam option class knows."""


def _register_runner_options() -> None:
    for name in _OPTION_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # the extra (e.g. apache-beam[dask]) is not installed
            pass


class _CheckingParser(_BeamArgumentParser):
    """Beam's option parser that raises instead of printing its usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UnknownOptionError(f"invalid pipeline option: {message}")


def _beam_parser() -> _BeamArgumentParser:
    """The parser ``PipelineOptions.get_all_options`` builds: every registered subclass's
    arguments, no abbreviations."""
    _register_runner_options()
    parser = _CheckingParser(allow_abbrev=False)
    subset: dict[str, type[PipelineOptions]] = {}
    for cls in PipelineOptions.__subclasses__():
        subset.setdefault(str(cls), cls)
    for cls in subset.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 (Beam's own hook, as get_all_options uses it)
    return parser


def beam_option_flags() -> list[str]:
    """Every ``--flag`` the registered Beam ``PipelineOptions`` subclasses accept."""
    parser = _beam_parser()
    return sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")})


def suggest_flag(flag: str, candidates: Sequence[str]) -> str | None:
    """The candidate closest to ``flag`` (difflib ratio ≥ 0.6; ``-`` and ``_`` compared alike),
    or None."""
    norm = {c.replace("-", "_"): c for c in candidates}
    match = difflib.get_close_matches(flag.replace("-", "_"), list(norm), n=1, cutoff=0.6)
    return norm[match[0]] if match else None


def check_pipeline_args(args: Sequence[str], *, own_flags: Sequence[str] = (),
                        allow_beamsynth_options: bool = False) -> None:
    """Refuse any argument Beam would not parse as a pipeline option.

    Args:
      args: what the CLI did not consume (``["--runner", "dask", "--rowz", "10"]``).
      own_flags: the subcommand's own flags, offered as suggestions (``--rows`` for ``--rowz``).
      allow_beamsynth_options: accept ``--beamsynth_*`` options (a Python job that reads them with
        ``privacy_job_from_options``); by default they are refused naming the CLI flag to use.

    Raises:
      UnknownOptionError: the first unknown option (or stray value), naming it, with the closest
        known flag ("did you mean --rows?"); ``--beamsynth_*`` options name the CLI flag to use.
    """
    args = list(args)
    if not args:
        return
    for arg in args:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name[2:] in CLI_EQUIVALENTS and not allow_beamsynth_options:
            raise UnknownOptionError(
                f"{name} is a pipeline option for Beam jobs that use beamsynth from Python; "
                f"on the command line use {CLI_EQUIVALENTS[name[2:]]}")
    parser = _beam_parser()
    _, unknown = parser.parse_known_args(args)  # a bad value of a known option raises here
    if not unknown:
        return
    flags = [f for f in unknown if f.startswith("-")]
    if not flags:
        raise UnknownOptionError(f"unexpected argument {unknown[0]!r}: every argument after the "
                                 "subcommand's own must be a --option of the subcommand or of Beam")
    name = flags[0].split("=", 1)[0]
    if name in own_flags:  # the whole command line was passed, the job's own flags included
        raise UnknownOptionError(f"{name} is this job's own option (own_flags); pass "
                                 "check_pipeline_args only what your parser left: args, "
                                 "beam_args = parser.parse_known_args()")
    known = [f for f in list(own_flags) + [s for a in parser._actions for s in a.option_strings]
             if f != name]
    hint = suggest_flag(name, known)
    raise UnknownOptionError(f"unrecognized option {name}"
                             + (f" (did you mean {hint}?)" if hint else "")
                             + ": neither beamsynth nor Beam knows it")
