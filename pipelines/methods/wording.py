"""How a method's build-time message spells an option: in the vocabulary of its caller.

A synthesis method is reached from the CLI (``--rows 5``, ``--pd-model-fraction 0.3``), from the
Python API (``rows=5``, ``options={'pd_model_fraction': 0.3}``) and from a Beam YAML step (``rows: 5``,
``options: {pd_model_fraction: 0.3}``). Its messages name options through
a :class:`Vocabulary` handed to it by the caller, so neither reads the other's words.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

__all__ = ["API_KEYWORDS", "Vocabulary"]

# Keywords of bs.Synthesize itself; every other option goes in its options={...}
API_KEYWORDS = frozenset({"epsilon", "delta", "rows", "count_fraction", "method"})
_NO_VALUE = object()


def _text(value: Any, *, quote: bool) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value) if quote else str(value)


class Vocabulary:
    """Spells options for one caller: ``"cli"`` (flags), ``"api"`` (Python keywords) or ``"yaml"``
    (a Beam YAML step's config keys).

    Args:
      caller: ``"cli"``, ``"api"`` or ``"yaml"``.
      flags: CLI only: option name (argparse destination) → flag, where it is not
        ``--`` + the name with dashes (``structure_fraction`` → ``--pb-structure-fraction``).
    """

    def __init__(self, caller: str = "cli", flags: Mapping[str, str] | None = None) -> None:
        if caller not in ("cli", "api", "yaml"):
            raise ValueError(f"caller ({caller!r}) must be 'cli', 'api' or 'yaml'")
        self.caller, self._flags = caller, dict(flags or {})

    @classmethod
    def cli(cls, method: Any) -> Vocabulary:
        """The CLI's flags, as ``method.add_arguments`` declares them."""
        parser = argparse.ArgumentParser(add_help=False)
        method.add_arguments(parser)
        return cls("cli", {a.dest: a.option_strings[0] for a in parser._actions
                           if a.option_strings and a.dest != "help"})

    def option(self, name: str, value: Any = _NO_VALUE) -> str:
        """``name`` (set to ``value``) as the caller writes it: ``--rows 5`` / ``rows=5`` /
        ``options={'k': 50}`` / ``rows: 5`` / ``options: {k: 50}``; a CLI switch (``value=True``)
        is its flag alone."""
        if self.caller == "cli":
            flag = self._flags.get(name, "--" + name.replace("_", "-"))
            return flag if value is _NO_VALUE or value is True else f"{flag} {_text(value, quote=False)}"
        shown = "..." if value is _NO_VALUE else _text(value, quote=True)
        if self.caller == "yaml":  # a Beam YAML step: its own config key, else in its options
            return f"{name}: {shown}" if name in API_KEYWORDS else f"options: {{{name}: {shown}}}"
        return f"{name}={shown}" if name in API_KEYWORDS else f"options={{{name!r}: {shown}}}"

    def method(self, name: str) -> str:
        """Choosing synthesis method ``name``: ``--method sbhg`` / ``bs.Synthesize(method='sbhg')`` /
        ``method: 'sbhg'``."""
        return self.option("method", name) if self.caller != "api" else (
            f"bs.Synthesize(method={name!r})")
