"""Domain extensions used by CatHist: vectorized word-pair encoding and the union domain."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from beamsynth.schemas.domains import (
    OUT_OF_DOMAIN,
    CategoricalDomain,
    ProductDomain,
    UnionDomain,
)
from beamsynth.transforms.noise import RandomSource

WORDS = CategoricalDomain([f"w{i}" for i in range(50)] + ["new york", "new", "a b"])
PAIRS = ProductDomain([WORDS, WORDS])
TOKENS = st.sampled_from(["w1", "w7", "w49", "new", "york", "new york", "a", "b", "zz", ""])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 3),
                          st.lists(TOKENS, min_size=0, max_size=4).map(" ".join)), max_size=30))
def test_product_encode_many_equals_scalar_encode(values):
    got = PAIRS.encode_many(values).tolist()
    assert got == [PAIRS.encode(v) for v in values]


def test_product_encode_many_round_trips():
    cells = np.array(PAIRS.sample_uniform(RandomSource(seed=1), 300))
    labels = PAIRS.decode_many(cells)
    assert PAIRS.encode_many(labels).tolist() == cells.tolist()


def test_union_domain_exact_size_and_round_trip():
    base = ProductDomain([WORDS, WORDS])
    union = UnionDomain(CategoricalDomain(["Female", "w1 w2", "w3 w4", "Other-thing"]), base)
    assert union.size == 4 + base.size - 2  # "w1 w2" and "w3 w4" are already word pairs
    assert union.encode("w1 w2") == 1 and union.encode("Female") == 0
    assert union.encode("nope") == OUT_OF_DOMAIN
    labels = [union.decode(i) for i in range(union.size)]
    assert len(set(labels)) == union.size  # one cell per value
    assert union.encode_many(labels).tolist() == list(range(union.size))
