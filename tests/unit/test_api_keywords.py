"""Keyword mistakes on the public mechanisms name the ``bs.`` class, the nearest keyword and the list.

Python's own message named the parent class (``bs.PrivBayes(row=100)``: "Synthesize.__init__() got
an unexpected keyword argument 'row'") and gave no hint.
"""

from __future__ import annotations

import inspect

import pytest

import beamsynth as bs
from beamsynth.transforms.private import PrivateTransform

PUBLIC = [getattr(bs, n) for n in bs.__all__
          if isinstance(getattr(bs, n), type) and issubclass(getattr(bs, n), PrivateTransform)]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: bs.PrivBayes(epsilon=1, row=100),
     "bs.PrivBayes got an unknown keyword 'row' (did you mean 'rows'?); it takes: epsilon, delta, "
     "rows, count_fraction, options, shard_rows, typed, label"),
    (lambda: bs.Synthesize(epsilon=1, methd="privbayes"),
     "bs.Synthesize got an unknown keyword 'methd' (did you mean 'method'?)"),
    (lambda: bs.Histogram(epsilon=1, colum="x"),
     "bs.Histogram got an unknown keyword 'colum' (did you mean 'column'?)"),
    (lambda: bs.Count(epsilon=1, zzz=2), "bs.Count got an unknown keyword 'zzz'; it takes: epsilon,"),
    (lambda: bs.Count(1.0), "bs.Count takes keyword arguments only (epsilon=, typed=, label=); got 1 "
                            "positional: 1.0"),
])
def test_keyword_mistakes_are_named(make, message) -> None:
    with pytest.raises(TypeError) as info:
        make()
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("cls", PUBLIC, ids=lambda c: c.__name__)
def test_every_public_mechanism_checks_its_keywords(cls) -> None:
    """Each one (now and added later) reports an unknown keyword under its own name; the check
    keeps the signature users and IDEs see."""
    assert len(PUBLIC) >= 9  # Count, Marginals, Histogram, PrefixTree, Synthesize and its 4 named forms
    with pytest.raises(TypeError, match=rf"^bs\.{cls.__name__} got an unknown keyword 'not_a_kw'"):
        cls(not_a_kw=1)
    assert "not_a_kw" not in inspect.signature(cls).parameters
    assert "epsilon" in inspect.signature(cls).parameters
