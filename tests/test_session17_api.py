"""Seventeenth session, H87: the plugin API as an ETL engineer meets it, seventh round.

Each test fails on the code before its fix (checked by reverting the fix on scratch):

1. a missing required keyword (``bs.Count()``, ``bs.Histogram(epsilon=1)``) raised Python's
   ``Count.__init__() missing 1 required keyword-only argument: 'epsilon'``, without the ``bs.``
   name or the keywords the step takes (the unknown-keyword and positional paths had both).
"""

from __future__ import annotations

import pytest

import beamsynth as bs


@pytest.mark.parametrize(("make", "message"), [
    (lambda: bs.Count(), "bs.Count needs epsilon= (no default); it takes: epsilon, typed, label"),
    (lambda: bs.Histogram(epsilon=1.0),
     "bs.Histogram needs column= (no default); it takes: column, epsilon, tolerance, typed, label"),
    (lambda: bs.Marginals(), "bs.Marginals needs marginals= and epsilon= (no defaults); it takes: "
                             "marginals, epsilon, typed, label"),
    (lambda: bs.PrivBayes(rows=10), "bs.PrivBayes needs epsilon= (no default); it takes: epsilon, "
                                    "delta, rows, count_fraction, options, shard_rows, typed, label"),
    (lambda: bs.PrivacyJob(delta=1e-6), "bs.PrivacyJob needs epsilon= (no default); it takes: "
                                        "epsilon, delta, privacy_unit, seed, name, disjoint"),
    (lambda: bs.DeclaredWindows(start=0, size=60),
     "bs.DeclaredWindows needs end= (no default); it takes: start, end, size"),
    (lambda: bs.WriteManifest(job=bs.PrivacyJob(epsilon=1.0)),
     "bs.WriteManifest needs path= (no default); it takes: job, path, output, label"),
])
def test_a_missing_required_keyword_names_the_step_and_its_keywords(make, message):
    with pytest.raises(TypeError) as err:
        make()
    assert str(err.value) == message


def test_the_other_keyword_errors_are_unchanged():
    with pytest.raises(TypeError, match=r"^bs.Count got an unknown keyword 'lable' \(did you mean "
                                        r"'label'\?\); it takes: epsilon, typed, label$"):
        bs.Count(lable="x")  # an unknown keyword is named first, also when epsilon is missing
    with pytest.raises(TypeError, match=r"call bs.Count\(epsilon=1.0\)$"):
        bs.Count(1.0)
    assert bs.PrivacyUnit().id_column is None  # no required keyword: nothing to say
