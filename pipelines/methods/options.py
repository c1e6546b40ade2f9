"""Method options checked once, for every caller: the Python API, Beam YAML, the CLI, releases.

A synthesis method declares its options once, as CLI flags (``add_arguments``), and their ranges
in ``option_limits``. :func:`check_options` (the API's ``bs.Synthesize``, Beam YAML's
``BeamsynthSynthesize``) refuses, when the pipeline is built, options that are not a mapping,
unknown names (with the nearest) and values of the wrong kind or out of range;
:func:`check_option_values` (every :class:`~beamsynth.pipelines.methods.registry.Method` when it
is constructed, so the CLI and release configs too) checks the kinds and ranges of the options
the method reads and returns them normalised (``2.0`` → ``2`` for a whole-number option, numpy
scalars → Python). Messages echo the bad value in the caller's words (:class:`Vocabulary`:
``--pb-refine-groups 0`` / ``options={'refine_groups': 0}`` / ``options: {refine_groups: 0}``).

Before (fifteenth session, H73): the API ran ``degree: 1.5`` as degree 1, ``pb_noise: 0`` and
``structure_fraction: 0`` as the defaults, ``sbhg_sizing: 'bogus'`` as ``off``, ``allow_non_dp:
'no'`` as true, and sbhg took ``input_rows: -1``; range errors named internal parameters
(``groups (0)`` for ``refine_groups``).
"""

from __future__ import annotations

import argparse
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from beamsynth.pipelines.methods.wording import API_KEYWORDS, Vocabulary

__all__ = ["AT_LEAST_ONE", "DELTA_NUMBER", "OPEN_FRACTION", "POSITIVE_NUMBER", "Limit",
           "check_option_values", "check_options", "cli_number", "option_actions", "whole_or"]


@dataclass(frozen=True)
class Limit:
    """A numeric option's range: ``low``/``high`` (None: unbounded), open or closed ends."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def text(self) -> str:
        """``>= 2``, ``> 1``, ``in (0, 1)``, ``in [0, 8]``."""
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                f"{')' if self.high_open else ']'}")


def whole_or(*words: str) -> Callable[[str], int | str]:
    """An argparse ``type`` for an option that is a whole number or one of ``words``
    (``--pb-refine-target-picks auto|N``); :func:`check_option_values` reads its ``words``."""
    def parse(text: str) -> int | str:
        if text in words:
            return text
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {' or '.join(words)} or a whole number") from None

    parse.words = words  # type: ignore[attr-defined]
    parse.__name__ = f"whole number or {'/'.join(words)}"
    return parse


def cli_number(kind: type = float, limit: Limit | None = None) -> Callable[[str], float | int]:
    """An argparse ``type`` for a command's numeric flag (``--epsilon``, ``--count-epsilon``,
    ``--max-contributions``, ...): a finite number (``kind=float``) or a whole number
    (``kind=int``) within ``limit``. Anything else is refused while the command line is parsed,
    before anything is read, spent or written (exit 2), naming the flag and echoing the text:
    ``argument --count-epsilon: 'nan' is not a finite number > 0``. Before (H101), such values
    reached the library's checks, which named the parameter (``epsilon (nan)`` for
    ``--count-epsilon nan``), and ``prefixes`` read its input before refusing them."""
    must = ("a finite number" if kind is float else "a whole number") + (
        f" {limit.text()}" if limit is not None else "")

    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {must}") from None
        if not math.isfinite(value) or limit is not None and not limit.holds(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {must}")
        return value

    parse.__name__ = must
    return parse


POSITIVE_NUMBER = cli_number(float, Limit(0, None, True))  # --epsilon, --count-epsilon, ...
OPEN_FRACTION = cli_number(float, Limit(0, 1, True, True))  # --count-fraction, --tolerance, ...
DELTA_NUMBER = cli_number(float, Limit(0, 1, False, True))  # --delta
AT_LEAST_ONE = cli_number(int, Limit(1))  # --max-contributions, --depth, ...


def option_actions(method_cls: Any) -> dict[str, argparse.Action]:
    """The method's options as declared for the CLI: destination → argparse action."""
    parser = argparse.ArgumentParser(add_help=False)
    method_cls.add_arguments(parser)
    return {a.dest: a for a in parser._actions if a.dest != "help"}


def _checked(action: argparse.Action, value: Any) -> tuple[Any, str]:
    """(the value the method reads, "") or (None, what it must be)."""
    if isinstance(action, argparse._StoreTrueAction):
        return (bool(value), "") if isinstance(value, (bool, np.bool_)) else (None, "true or false")
    if action.choices is not None:
        if isinstance(value, str) and value in action.choices:
            return value, ""
        return None, "one of " + ", ".join(action.choices)
    words = getattr(action.type, "words", ())  # whole_or: a word, else a whole number
    if isinstance(value, str) and value in words:
        return value, ""
    kind = int if words else action.type
    if kind not in (int, float):
        return (value, "") if isinstance(value, str) else (None, "text")
    what = ("a whole number" if kind is int else "a finite number") + "".join(
        f" or {w}" for w in words)
    # a quoted "3" is refused too: YAML and the API would otherwise read text numbers differently
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        return None, what
    if isinstance(value, (int, np.integer)):  # exact, also beyond 2**53
        return (int(value) if kind is int else float(value)), ""
    try:
        got = float(value)
    except (TypeError, ValueError, OverflowError):
        return None, what
    if not math.isfinite(got) or kind is int and got != int(got):
        return None, what
    return (int(got) if kind is int else got), ""


def check_option_values(method_cls: Any, options: Mapping[str, Any], say: Vocabulary, *,
                        where: str = "", text_note: Callable[[str], str] | None = None
                        ) -> dict[str, Any]:
    """``options`` with the method's own options checked and normalised; other keys (the CLI's
    other arguments, ``rows``) pass unchanged, ``None`` is the method's default. Raises
    ``ValueError`` naming the option as ``say`` spells it, echoing the value and what it must be.
    ``where``: a prefix for the message (a YAML step's name); ``text_note(value)``: why a number
    came as text (Beam YAML's reading of ``1e-6``)."""
    actions = option_actions(method_cls)
    limits: Mapping[str, Limit] = getattr(method_cls, "option_limits", {})
    out = dict(options)
    for name, value in options.items():
        if name not in actions or value is None:
            continue
        got, must = _checked(actions[name], value)
        limit = limits.get(name)
        if not must and limit is not None and not isinstance(got, str) and not limit.holds(got):
            must = ("a number " if actions[name].type is float else "a whole number ") + limit.text()
        if must:
            why = (f"; {text_note(value)}" if text_note is not None and isinstance(value, str)
                   and must.split(" ")[-1] == "number" else "")
            raise ValueError(f"{where}{say.option(name, value)} must be {must}{why} (method "
                             f"{method_cls.name!r}; docs/options.md)")
        out[name] = got
    return out


def check_options(method_cls: Any, options: Any, say: Vocabulary, *, where: str = "",
                  text_note: Callable[[str], str] | None = None) -> dict[str, Any]:
    """A caller's ``options`` for ``method_cls`` (the API's ``options={...}``, a YAML step's
    ``options:``), refused when the pipeline is built if it is not a mapping, names an option the
    method does not read (with the nearest name: a typo would run without it, silently), or gives
    one of the wrong kind or out of range (:func:`check_option_values`). Returns the checked
    options (``{}`` for ``None``)."""
    if options is None:
        return {}
    shown = "options: {target: income}" if say.caller == "yaml" else "options={'target': 'income'}"
    if not isinstance(options, Mapping):
        raise ValueError(f"{where}options ({options!r}) must be a mapping of method options, e.g. "
                         f"{shown} (docs/options.md)")
    known = sorted(option_actions(method_cls))
    for name in options:
        if name not in known:  # the nearest option, or the nearest keyword of the step itself
            close = difflib.get_close_matches(str(name), known + sorted(API_KEYWORDS), n=1,
                                              cutoff=0.6)
            hint = ("" if not close else f" (did you mean {close[0]!r}?)" if close[0] in known
                    else f" (did you mean {say.option(close[0])}, not in options?)")
            raise ValueError(f"{where}unknown option {name!r} for method {method_cls.name!r}{hint}"
                             + f"; its options: {', '.join(known) or 'none'} (docs/options.md)")
    return check_option_values(method_cls, options, say, where=where, text_note=text_note)
