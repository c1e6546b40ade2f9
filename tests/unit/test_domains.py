"""Declared domains: exact sizes, encode/decode, sampling without enumeration."""

import math

import numpy as np
import pytest

from beamsynth.schemas.domains import (
    MALFORMED,
    OUT_OF_DOMAIN,
    CategoricalDomain,
    DatetimeDomain,
    FloatDomain,
    IntegerDomain,
    ProductDomain,
    StringDomain,
    domain_from_spec,
)
from beamsynth.transforms.noise import RandomSource


def test_categorical_roundtrip_and_other():
    d = CategoricalDomain(["a", "b", "c"], other="OTHER")
    assert d.size == 4 and d.other_index == 3
    assert d.encode("b") == 1 and d.encode("zz") == OUT_OF_DOMAIN
    assert d.decode_many(np.array([0, 3])) == ["a", "OTHER"]
    assert d.encode_many([1, "c", None]).tolist() == [OUT_OF_DOMAIN, 2, OUT_OF_DOMAIN]


def test_categorical_matches_non_string_inputs_by_string_form():
    d = CategoricalDomain(["1", "2"])
    assert d.encode_many([1, 2, 3]).tolist() == [0, 1, OUT_OF_DOMAIN]


def test_categorical_duplicates_rejected():
    with pytest.raises(ValueError, match="duplicate categories"):
        CategoricalDomain(["a", "a"])


def test_categorical_from_file(tmp_path):
    f = tmp_path / "words.txt"
    f.write_text("apple\nbanana\n\napple\ncherry\n", encoding="utf-8")
    d = CategoricalDomain.from_file(f)
    assert d.values == ["apple", "banana", "cherry"]


def test_integer_domain_cells_and_bins():
    d = IntegerDomain(low=0, high=9)
    assert d.size == 10 and d.encode(3) == 3 and d.encode(10) == OUT_OF_DOMAIN
    b = IntegerDomain(low=0, high=99, edges=[0, 10, 50, 100])
    assert b.size == 3
    assert b.encode_many(["5", 10, "99", "100", "x", "1.5", "nan"]).tolist() == [
        0, 1, 2, OUT_OF_DOMAIN, MALFORMED, MALFORMED, MALFORMED]
    vals = b.decode_many(np.array([1] * 1000), RandomSource(seed=1))
    assert min(vals) >= 10 and max(vals) <= 49 and len(set(vals)) > 20


def test_integer_bins_count():
    d = IntegerDomain(low=1, high=10, bins=3)
    assert d.size == 3 and d.edges.tolist() == [1, 5, 9, 11]


@pytest.mark.parametrize("kwargs,match", [
    ({"low": 5, "high": 1}, r"low \(5\) must be <= high \(1\)"),
    ({"low": 0, "high": 9, "edges": [0, 5, 5, 10]}, "must increase strictly"),
    ({"low": 0, "high": 9, "edges": [1, 10]}, "must start at low"),
    ({"low": 0, "high": 9, "bins": 0}, r"bins \(0\) must be an int >= 1"),
])
def test_integer_domain_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        IntegerDomain(**kwargs)


def test_float_domain():
    d = FloatDomain(low=0.0, high=1.0, bins=4)
    assert d.encode_many([0.0, 0.26, 1.0, 1.01, "inf", "x"]).tolist() == [
        0, 1, 3, OUT_OF_DOMAIN, MALFORMED, MALFORMED]
    v = d.decode_many(np.array([2] * 200), RandomSource(seed=2))
    assert min(v) >= 0.5 and max(v) < 0.75
    with pytest.raises(ValueError, match="exactly one of bins or edges"):
        FloatDomain(low=0, high=1)


def test_datetime_domain():
    d = DatetimeDomain(start="2020-01-01", end="2020-12-31", granularity="day")
    assert d.size == 366
    assert d.encode_many(["2020-01-01", "2020-03-01T10:00:00", "2021-01-01", "garbage"]).tolist() == [
        0, 60, OUT_OF_DOMAIN, MALFORMED]
    assert d.decode(60) == "2020-03-01"
    m = DatetimeDomain(start="2019-11-15", end="2020-02-01", granularity="month")
    assert m.size == 4 and m.encode("2020-01-20") == 2 and m.decode(2) == "2020-01-01"


def test_string_domain_index_math():
    d = StringDomain(alphabet="ab", min_length=1, max_length=3)
    assert d.size == 2 + 4 + 8
    all_values = [d.decode(i) for i in range(d.size)]
    assert len(set(all_values)) == d.size
    assert [d.encode(v) for v in all_values] == list(range(d.size))
    assert d.encode("abc") == OUT_OF_DOMAIN and d.encode("abab") == OUT_OF_DOMAIN


def test_huge_string_domain_exact_size():
    d = StringDomain(alphabet="abcdefghijklmnopqrstuvwxyz", min_length=0, max_length=20)
    assert d.size == sum(26**k for k in range(21))
    idx = d.encode("differential")
    assert d.decode(idx) == "differential"


def test_product_domain_word_pairs():
    words = CategoricalDomain([f"w{i}" for i in range(1000)] + ["new york"])
    d = ProductDomain([words, words])
    assert d.size == 1001**2
    i = d.encode("w7 w999")
    assert d.decode(i) == "w7 w999"
    j = d.encode("new york w3")  # a part containing the separator
    assert d.decode(j) == "new york w3"
    assert d.encode("w7") == OUT_OF_DOMAIN and d.encode("w7 nope") == OUT_OF_DOMAIN


def test_sample_distinct_excludes_and_never_enumerates_huge_domain():
    words = CategoricalDomain([f"w{i}" for i in range(104_334)])
    d = ProductDomain([words, words])
    assert d.size == 104_334**2
    rs = RandomSource(seed=3)
    exclude = {0, 1, 2, d.size - 1}
    got = d.sample_distinct(rs, 500, exclude=exclude)
    assert len(set(got)) == 500 and not (set(got) & exclude)
    assert max(got) > d.size // 2  # spread over the whole index range


def test_sample_distinct_small_domain_exact():
    d = CategoricalDomain(list("abcdef"))
    rs = RandomSource(seed=4)
    counts = np.zeros(6)
    for i in range(3000):
        for c in d.sample_distinct(rs.child(i), 2, exclude={0, 1}):
            counts[c] += 1
    assert counts[0] == counts[1] == 0
    assert np.allclose(counts[2:] / counts[2:].sum(), 0.25, atol=0.03)
    with pytest.raises(ValueError, match="cannot draw 5 distinct cells"):
        d.sample_distinct(rs, 5, exclude={0, 1})


def test_sample_uniform_over_domain_larger_than_int64():
    d = StringDomain(alphabet="ab", min_length=0, max_length=70)
    assert d.size > 2**63
    got = d.sample_uniform(RandomSource(seed=5), 20)
    assert all(0 <= g < d.size for g in got)
    assert math.log2(max(got)) > 60


def test_domain_from_spec_errors_name_location():
    with pytest.raises(ValueError, match=r"^col: unknown key\(s\) \['bins'\]"):
        domain_from_spec({"kind": "categorical", "values": ["a"], "bins": 3}, where="col")
    with pytest.raises(ValueError, match="kind \\('nope'\\) must be one of"):
        domain_from_spec({"kind": "nope"})
    with pytest.raises(ValueError, match="missing required key"):
        domain_from_spec({"kind": "integer", "low": 0})
    d = domain_from_spec({"kind": "product", "parts": [{"kind": "categorical", "values": ["a", "b"]},
                                                      {"kind": "integer", "low": 0, "high": 2}]})
    assert d.size == 6 and d.decode(d.encode("b 2")) == "b 2"


def test_union_domain_from_spec(tmp_path):
    words = tmp_path / "w.txt"
    words.write_text("alpha\nbeta\nMale\n", encoding="utf-8")
    d = domain_from_spec({"kind": "union", "parts": [
        {"kind": "categorical", "values": ["Female", "Male"]},
        {"kind": "product", "parts": [{"kind": "categorical", "values_file": str(words)}] * 2}]})
    assert d.size == 2 + 9  # "Male" is a codebook value and not a pair: no overlap among pairs
    assert d.decode(d.encode("Male")) == "Male" and d.decode(d.encode("alpha beta")) == "alpha beta"
    with pytest.raises(ValueError, match="a union needs exactly two parts"):
        domain_from_spec({"kind": "union", "parts": [{"kind": "integer", "low": 0, "high": 1},
                                                      {"kind": "integer", "low": 0, "high": 1}]})


def test_datetime_mixed_utc_offsets_encode_instead_of_crashing_the_block():
    # pandas refuses a mixed-offset column without utc=True (FutureWarning, then an object
    # Series on which .dt raised AttributeError): one bad row used to kill the whole block.
    d = DatetimeDomain(start="2020-01-01", end="2020-12-31", granularity="day")
    codes = d.encode_many(["2020-03-04T23:30:00-01:00", "2020-03-04T05:00:00+02:00",
                           "2020-03-04", "not a date"])
    assert codes.tolist() == [64, 63, 63, MALFORMED]  # offsets converted to UTC, naive kept


def test_numeric_domains_reject_booleans_instead_of_reading_them_as_1_and_0():
    # JSON/Avro/Parquet booleans in a numeric column used to be encoded silently as 1 and 0
    assert IntegerDomain(low=0, high=10).encode_many([True, False, 3, "4"]).tolist() == [
        MALFORMED, MALFORMED, 3, 4]
    assert FloatDomain(low=0, high=1, bins=2).encode_many([np.bool_(True), 0.75]).tolist() == [
        MALFORMED, 1]
