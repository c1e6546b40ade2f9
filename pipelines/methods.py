"""Synthesis methods: a registry so that adding a mechanism to the CLI and releases is one line.

A method is a class with a ``name``, CLI options, and a constructor that **spends its budget on
the accountant** (so overspending fails while the pipeline is built), plus ``expand_model``
turning bounded ``EncodedBatch`` records into one ``SynthesisModel`` per window.
"""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from typing import Any

import apache_beam as beam
from beamsynth.schemas.schema import Schema
from beamsynth.transforms.budget import ApproxDP, PrivacyAccountant
from beamsynth.transforms.synthesis import DPIndependentMarginals

__all__ = ["METHODS", "Method", "IndependentMethod", "register", "get_method"]


class Method(ABC):
    """A synthesis mechanism as seen by the ``synthesize`` pipeline."""

    name: str = ""
    description: str = ""

    def __init__(self, *, schema: Schema, accountant: PrivacyAccountant, budget: ApproxDP,
                 max_contributions: int, seed: int | None, options: dict[str, Any]) -> None:
        self.schema = schema
        self.accountant = accountant
        self.budget = budget
        self.max_contributions = max_contributions
        self.seed = seed
        self.options = options

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Method-specific CLI options (none by default)."""

    @abstractmethod
    def expand_model(self, batches: beam.PCollection) -> beam.PCollection:
        """Bounded ``EncodedBatch`` records → one ``SynthesisModel`` per window."""

    def details(self) -> dict[str, Any]:
        """Method parameters for the manifest."""
        return {}


class IndependentMethod(Method):
    """Noisy 1-way marginals of every column (discrete Laplace), columns sampled independently."""

    name = "independent"
    description = "independent noisy 1-way marginals"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        per_column = self.budget.epsilon / len(self.schema.columns)
        self.accountant.spend(
            "independent.marginals", self.budget, mechanism="discrete Laplace on 1-way marginals",
            details={
                "tables": len(self.schema.columns),
                "epsilon_per_table": per_column,
                "scale_per_table": self.max_contributions / per_column,
                "sensitivity_per_table": self.max_contributions,
                "paper": "Laplace mechanism (Dwork et al. 2006); DataSynthesizer independent mode (seed 004)",
            },
        )

    def expand_model(self, batches):
        return batches | "IndependentMarginals" >> DPIndependentMarginals(
            schema=self.schema, budget=self.budget, max_contributions=self.max_contributions,
            seed=self.seed)


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    """Add a method class to the registry (usable as a decorator)."""
    if not cls.name:
        raise ValueError(f"method class {cls.__name__} has no name")
    METHODS[cls.name] = cls
    return cls


def get_method(name: str) -> type[Method]:
    """The method class called ``name``."""
    _load_optional_methods()
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; available: {sorted(METHODS)}") from None


# Methods living in their own modules register themselves on import. Adding one: append its
# module here.
_METHOD_MODULES: list[str] = []


def _load_optional_methods() -> None:
    import importlib

    for mod in _METHOD_MODULES:
        importlib.import_module(mod)


register(IndependentMethod)
