"""Sixteenth session, H82: the ordered API release at scale, and the rounded-id count.

Each test fails on the code before its change (checked by reverting it):

1. ``Synthesize``'s rows step gathered every sampling shard of a window under one key (H81,
   c68f2b1), which put the Arrow → Row conversion of all synthetic rows (and the user's sink,
   fused after it) on one worker: measured with 1M rows to ``WriteToText`` on ``direct-multi``,
   the launcher's peak RSS 267 → 1,249 MB and the largest worker's 294 → 869 MB (growing with
   the rows; ``benchmarks/api_ordered_rows.py``). Sampling shards are no longer gathered (each
   shard's rows stay together, in sample order); releases bounded by declared numbers
   (plausible's candidates, prefix-tree levels and keys) still are.
2. ``count_rounded_ids`` (the manifest's ``operational.privacy_ids_rounded``) gives the count
   of the regex-and-int rule it replaces on every text, with a cheaper per-id rule.
"""

from __future__ import annotations

import random
import re

import apache_beam as beam
import numpy as np
import pytest

import beamsynth as bs
from beamsynth.schemas.schema import count_rounded_ids
from tests.test_session15_api_polish import SCHEMA, _records  # sex, city, band


def _gathers(build) -> list[str]:
    """Full labels of the rows steps' gathers (``_RowsInOrder``'s ``GatherAll``) of a built job."""
    job = bs.PrivacyJob(epsilon=400.0, delta=1e-5, seed=5)
    p = beam.Pipeline()
    private = p | beam.Create(_records(50)) | job.private(SCHEMA)
    build(private)
    found: list[str] = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def enter_composite_transform(self, node):
            if node.full_label.endswith("/GatherAll"):
                found.append(node.full_label)

        def visit_transform(self, node):
            self.enter_composite_transform(node)

    p.visit(Visitor())
    return found


# -- 1. sampling shards are not gathered; declared-bounded releases are ---------------------------
def test_synthesis_rows_are_not_gathered_on_one_worker():
    """Built only (no run): ``IndependentSynthesis``/``PrivBayes`` rows come straight from their
    sampling shards (no ``GatherAll``); ``PlausibleDeniability`` (at most its declared candidates)
    and ``PrefixTree`` (levels and keys) keep H81's gather. Before: every one gathered."""
    found = _gathers(lambda private: [
        private | "Indep" >> bs.IndependentSynthesis(epsilon=1.0, rows=600, shard_rows=100),
        private | "PB" >> bs.PrivBayes(epsilon=1.0, rows=600, shard_rows=100),
        private | "PD" >> bs.PlausibleDeniability(epsilon=40.0, delta=1e-6, rows=10),
    ])
    assert not [f for f in found if f.startswith(("Indep/", "PB/"))], found
    assert [f for f in found if f.startswith("PD/")], found


# -- 2. the rounded-id count -------------------------------------------------------------------
_OLD = re.compile(r"[+-]?[0-9]{16,}")


def _old_count(pids) -> int:
    """The rule before H82 (regex, then int): the reference the new count must equal."""
    return sum(1 for p in pids if len(p) > 15 and _OLD.fullmatch(p) and abs(int(p)) >= 2**53)


def test_count_rounded_ids_equals_the_regex_rule():
    """Edge texts (signs, leading zeros, 2**53 - 1/2**53/2**53 + 1, non-ASCII digits, 15 digits
    with a sign, letters) and 20,000 random ones: the same count as the old rule, text by text
    and per batch."""
    edge = ["", "7", "+" + "1" * 15, "0" * 20 + "1", "-9007199254740992", "9007199254740991",
            "9007199254740992", "9007199254740993", "+09007199254740993", "-00009007199254740993",
            "１" * 16, "12345678901234567a", "9" * 23, "-" + "0" * 16, "1e+16", " 9007199254740993",
            "10000000000000000", "0009007199254740991", "٩" * 17, "+-9007199254740993"]
    for text in edge:
        assert count_rounded_ids(np.array([text], dtype=object)) == _old_count([text]), text
    rnd = random.Random(7)
    texts = []
    for _ in range(20_000):
        digits = "".join(rnd.choice("0123456789") for _ in range(rnd.randrange(12, 21)))
        texts.append(rnd.choice(["", "+", "-", "0", "00"]) + digits)
    batch = np.array(texts, dtype=object)
    assert count_rounded_ids(batch) == _old_count(texts) > 0
    assert count_rounded_ids(texts) == _old_count(texts)  # a list as well as an array
    assert count_rounded_ids(np.array(["1", "22", "-3"], dtype=object)) == 0
    assert count_rounded_ids(np.array([], dtype=object)) == 0 and count_rounded_ids(None) == 0


@pytest.mark.parametrize("value,rounded", [(2**53, 1), (2**53 - 1, 0), (10**18, 1), (-10**18, 1),
                                           (float(2**60), 1), ("9007199254740993", 1), (7, 0)])
def test_encoded_ids_counted_as_before(value, rounded):
    """Through the encoder (``privacy_id_text``'s texts): an id of 2**53 or more is counted,
    whatever its spelling."""
    from beamsynth.schemas.schema import encode_privacy_ids

    pids, _ = encode_privacy_ids([value], "pid")
    assert count_rounded_ids(pids) == _old_count(pids) == rounded
