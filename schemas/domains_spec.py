"""Domains from their declarative form (a schema file's ``domain:``): :func:`domain_from_spec`.

Shapes: a ``dict`` as read from YAML/JSON (``kind`` plus that kind's keys; ``values_file`` paths
relative to ``base_dir``) → a :class:`~beamsynth.schemas.domains_base.Domain`; every error is a
``ValueError`` whose message starts with ``where`` (the column's path in the schema).

Privacy: this is where domains are declared; nothing is read from the private data (rule 1).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from beamsynth.schemas.domains_base import Domain
from beamsynth.schemas.domains_numeric import DatetimeDomain, FloatDomain, IntegerDomain
from beamsynth.schemas.domains_text import (
    CategoricalDomain,
    ProductDomain,
    StringDomain,
    UnionDomain,
)

__all__ = [
    "domain_from_spec",
]


# -- construction from a declarative spec -------------------------------------------------------
def domain_from_spec(spec: Any, *, base_dir: Path | None = None, where: str = "domain") -> Domain:
    """Build a domain from its schema form. ``where`` prefixes every error message.

    Forms::

        {kind: categorical, values: [a, b], other: OTHER}
        {kind: categorical, values_file: words.txt}
        {kind: integer, low: 0, high: 99, bins: 10}          # or edges: [...], or neither
        {kind: float, low: 0, high: 1, bins: 20}             # or edges: [...]
        {kind: datetime, start: 2020-01-01, end: 2020-12-31, granularity: day}
        {kind: string, alphabet: "abc", min_length: 1, max_length: 8}
        {kind: product, separator: " ", parts: [<domain>, <domain>]}
        {kind: union, parts: [<categorical domain>, <any domain>]}  # codebook ∪ huge base
    """
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a domain must be a mapping, got {type(spec).__name__}")
    kind = spec.get("kind")
    allowed = {
        "categorical": {"kind", "values", "values_file", "other"},
        "integer": {"kind", "low", "high", "bins", "edges"},
        "float": {"kind", "low", "high", "bins", "edges"},
        "datetime": {"kind", "start", "end", "granularity"},
        "string": {"kind", "alphabet", "min_length", "max_length"},
        "product": {"kind", "parts", "separator"},
        "union": {"kind", "parts"},
    }
    if kind not in allowed:
        raise ValueError(f"{where}: kind ({kind!r}) must be one of {sorted(allowed)}")
    unknown = set(spec) - allowed[kind]
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {sorted(unknown)} for a {kind} domain "
            f"(allowed: {sorted(allowed[kind])})"
        )
    try:
        if kind == "categorical":
            if ("values" in spec) == ("values_file" in spec):
                raise ValueError("give exactly one of 'values' or 'values_file'")
            if "values_file" in spec:
                path = Path(spec["values_file"])
                if not path.is_absolute() and base_dir is not None:
                    path = base_dir / path
                return CategoricalDomain.from_file(path, other=spec.get("other"))
            values = spec["values"]
            if not isinstance(values, list):
                raise ValueError(f"'values' must be a list, got {type(values).__name__}")
            return CategoricalDomain(values, other=spec.get("other"))
        if kind == "integer":
            _require(spec, ("low", "high"))
            return IntegerDomain(
                low=spec["low"], high=spec["high"], bins=spec.get("bins"), edges=spec.get("edges")
            )
        if kind == "float":
            _require(spec, ("low", "high"))
            return FloatDomain(
                low=spec["low"], high=spec["high"], bins=spec.get("bins"), edges=spec.get("edges")
            )
        if kind == "datetime":
            _require(spec, ("start", "end"))
            start, end = spec["start"], spec["end"]
            return DatetimeDomain(
                start=start.isoformat() if isinstance(start, (_dt.date,)) else str(start),
                end=end.isoformat() if isinstance(end, (_dt.date,)) else str(end),
                granularity=spec.get("granularity", "day"),
            )
        if kind == "string":
            _require(spec, ("alphabet", "max_length"))
            return StringDomain(
                alphabet=str(spec["alphabet"]),
                min_length=spec.get("min_length", 0),
                max_length=spec["max_length"],
            )
        parts = spec.get("parts")
        if not isinstance(parts, list):
            raise ValueError("'parts' must be a list of domains")
        built = [
            domain_from_spec(p, base_dir=base_dir, where=f"{where}.parts[{i}]")
            for i, p in enumerate(parts)
        ]
        if kind == "union":
            if len(built) != 2 or not isinstance(built[0], CategoricalDomain):
                raise ValueError(
                    "a union needs exactly two parts: a categorical domain, then any domain"
                )
            return UnionDomain(built[0], built[1])
        return ProductDomain(built, separator=str(spec.get("separator", " ")))
    except (TypeError, ValueError) as exc:
        msg = str(exc)
        if msg.startswith(where):
            raise
        raise ValueError(f"{where}: {msg}") from exc


def _require(spec: dict[str, Any], keys: Iterable[str]) -> None:
    missing = [k for k in keys if k not in spec]
    if missing:
        raise ValueError(f"missing required key(s) {missing}")
