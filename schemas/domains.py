"""Declared domains: finite sets of cells that are public, immutable and never read off the data.

Every domain knows its exact size (a Python int, possibly 10^10 or more), encodes a value to a
cell index (or :data:`OUT_OF_DOMAIN`), decodes a cell index back to a value, and samples cells
uniformly **without enumerating** itself. Numeric domains map values to declared bins; decoding a
bin for synthesis draws a value inside the bin.

Codes used by the vectorized encoders (``encode_many``):

* ``>= 0`` — the cell index;
* :data:`OUT_OF_DOMAIN` (-1) — a well-formed value outside the declared domain;
* :data:`MALFORMED` (-2) — a value that cannot be parsed as the column's type.

Modules (this one re-exports their public names, ``__all__``, and :func:`parse_numbers`; import
from here in user code):

* :mod:`~beamsynth.schemas.domains_base` — :class:`Domain` (size, encode/decode, sampling without
  enumeration), the codes, :func:`parse_numbers` (raw values → floats, each value alone);
* :mod:`~beamsynth.schemas.domains_numeric` — :class:`IntegerDomain`, :class:`FloatDomain`,
  :class:`DatetimeDomain` (ordered, declared ranges and bins);
* :mod:`~beamsynth.schemas.domains_text` — :class:`CategoricalDomain`, :class:`StringDomain`,
  :class:`ProductDomain`, :class:`UnionDomain`;
* :mod:`~beamsynth.schemas.domains_spec` — :func:`domain_from_spec` (the schema file's form).
"""

from __future__ import annotations

from beamsynth.schemas.domains_base import MALFORMED, OUT_OF_DOMAIN, Domain
from beamsynth.schemas.domains_base import parse_numbers as parse_numbers
from beamsynth.schemas.domains_numeric import DatetimeDomain, FloatDomain, IntegerDomain
from beamsynth.schemas.domains_spec import domain_from_spec
from beamsynth.schemas.domains_text import (
    CategoricalDomain,
    ProductDomain,
    StringDomain,
    UnionDomain,
)

__all__ = [
    "MALFORMED",
    "OUT_OF_DOMAIN",
    "CategoricalDomain",
    "DatetimeDomain",
    "Domain",
    "FloatDomain",
    "IntegerDomain",
    "ProductDomain",
    "StringDomain",
    "UnionDomain",
    "domain_from_spec",
]
