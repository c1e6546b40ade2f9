"""Key codecs: normalization, dead-letter reasons, decode(encode(x)) in the right cell."""

import decimal

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beamsynth.schemas.domains_base import parse_numbers
from beamsynth.schemas.keys import (
    HierarchyKeyCodec,
    KeySpecError,
    SpatialKeyCodec,
    TextKeyCodec,
    key_codec_from_spec,
    load_key_spec,
    prefix_bytes,
)
from beamsynth.transforms.noise import RandomSource


def _enc(codec, values, column="q"):
    return codec.encode({column: pd.Series(values, dtype=object)})


def test_text_casefold_eos_and_roundtrip():
    c = TextKeyCodec(column="q", max_length=5)
    codes, bad = _enc(c, ["The", "a b.", "", "x9"])
    assert bad == []
    assert codes.shape == (4, 6)
    assert c.strings(codes) == ["the", "a b.", "", "x9"]
    assert c.labels(codes) == ["the$", "a b.$", "$", "x9$"]
    assert c.is_complete(codes).all()
    assert c.decode(codes)["q"].tolist() == ["the", "a b.", "", "x9"]
    # EOS directly after the last character, padding 0 after it
    assert codes[0, 3] == c.eos and codes[0, 4] == 0


def test_text_rejects_with_reasons_and_drop_map_truncate():
    c = TextKeyCodec(column="q", max_length=4)
    codes, bad = _enc(c, ["don't", "abcdefg", None, "ok"])
    assert [i for i, _ in bad] == [0, 1, 2]
    assert "outside the declared alphabet" in bad[0][1] and "'" in bad[0][1]
    assert "exceeds the declared max_length 4" in bad[1][1]
    assert bad[2][1] == "missing value"
    assert c.strings(codes) == ["ok"]
    d = TextKeyCodec(column="q", max_length=4, on_other="drop", on_too_long="truncate",
                     char_map={"-": " "}, casefold=False, alphabet="abcdnotDN -")
    codes, bad = _enc(d, ["Don't", "a-b", "abcdefg"])
    assert bad == []
    assert d.strings(codes) == ["Dont", "a b", "abcd"]


def test_text_valid_children_only_eos_at_max_length():
    c = TextKeyCodec(column="q", max_length=2)
    v = c.valid_children(np.array([[1, 2]], dtype=np.uint8))
    assert v.sum() == 1 and v[0, c.eos - 1]
    assert c.valid_children(np.array([[1]], dtype=np.uint8)).all()


def test_text_wide_alphabet_uses_two_byte_symbols():
    alphabet = "".join(chr(0x4E00 + i) for i in range(300))
    c = TextKeyCodec(column="q", alphabet=alphabet, max_length=3, casefold=False)
    codes, bad = _enc(c, [alphabet[299] + alphabet[0]])
    assert bad == [] and codes.dtype == np.dtype(">u2")
    assert c.strings(codes) == [alphabet[299] + alphabet[0]]
    assert prefix_bytes(codes, 2).dtype.itemsize == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"max_length": 0}, "max_length (0) must be an int in [1, 1000]"),
    ({"alphabet": "aa"}, "alphabet ('aa') must be a non-empty string of distinct characters"),
    ({"on_other": "keep"}, "on_other ('keep') must be one of 'reject', 'drop'"),
    ({"char_map": {"x": "é"}}, "maps to characters outside the alphabet"),
])
def test_text_validation_messages(kwargs, message):
    with pytest.raises(KeySpecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        TextKeyCodec(column="q", **kwargs)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-90, 90), st.floats(-180, 180)), min_size=1, max_size=30),
       st.integers(1, 12))
def test_spatial_decode_of_encode_lands_in_the_same_cell(points, depth):
    c = SpatialKeyCodec(columns=("lat", "lon"), box=((-90, 90), (-180, 180)), depth=12)
    pts = np.array(points)
    codes = c.encode_points(pts)
    prefixes = codes[:, :depth]
    dec = c.decode(prefixes, RandomSource(seed=1))
    again = c.encode_points(np.column_stack([dec["lat"], dec["lon"]]))
    np.testing.assert_array_equal(again[:, :depth], prefixes)
    low, side = c.cells(prefixes)
    assert np.all(pts >= low - 1e-9) and np.all(pts <= low + side + 1e-9)


def test_spatial_rejects_outside_and_non_numbers_clip_mode():
    c = SpatialKeyCodec(columns=("x", "y"), box=((0, 1), (0, 2)), depth=3)
    codes, bad = c.encode({"x": pd.Series(["0.5", "abc", "2", "1"]), "y": pd.Series(["1", "1", "1", "2"])})
    assert [i for i, _ in bad] == [1, 2]
    assert "not a number" in bad[0][1] and "outside the declared box" in bad[1][1]
    assert codes.shape == (2, 3)
    # the top corner belongs to the last cell at every level
    assert (codes[1] == 4).all()
    clip = SpatialKeyCodec(columns=("x", "y"), box=((0, 1), (0, 2)), depth=3, on_outside="clip")
    codes, bad = clip.encode({"x": pd.Series(["5"]), "y": pd.Series(["-1"])})
    assert bad == [] and codes.shape == (1, 3)
    assert c.cell_diameter(1) == pytest.approx(np.hypot(0.5, 1.0))


def test_spatial_three_dimensions_fanout_eight():
    c = SpatialKeyCodec(columns=("a", "b", "c"), box=((0, 1),) * 3, depth=4)
    assert c.fanout == 8
    codes = c.encode_points(np.array([[0.9, 0.1, 0.6]]))
    low, side = c.cells(codes[:, :1])
    np.testing.assert_allclose(low, [[0.5, 0.0, 0.5]])


TREE = {"CA": {"QC": ["Montreal", "Quebec"], "ON": ["Toronto"]}, "FR": {"IDF": ["Paris"]}}


def test_hierarchy_encode_reject_and_decode_descendant():
    c = HierarchyKeyCodec(columns=("country", "region", "city"), tree=TREE)
    cols = {"country": pd.Series(["CA", "CA", "FR", "FR"]), "region": pd.Series(["QC", "ON", "IDF", "QC"]),
            "city": pd.Series(["Quebec", "Toronto", "Paris", "Montreal"])}
    codes, bad = c.encode(cols)
    assert [i for i, _ in bad] == [3]
    assert "region value 'QC' is not declared under FR" in bad[0][1]
    assert codes.tolist() == [[1, 1, 2], [1, 2, 1], [2, 1, 1]]
    assert c.labels(codes) == ["CA/QC/Quebec", "CA/ON/Toronto", "FR/IDF/Paris"]
    v = c.valid_children(np.array([[1], [2]], dtype=np.uint8))
    assert v.tolist() == [[True, True], [True, False]]
    dec = c.decode(np.array([[1]] * 50, dtype=np.uint8), RandomSource(seed=2))
    assert set(dec["country"]) == {"CA"}
    assert set(zip(dec["region"], dec["city"])) <= {("QC", "Montreal"), ("QC", "Quebec"), ("ON", "Toronto")}


def test_spec_loading_and_errors(tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("key:\n  kind: spatial\n  columns: [lat, lon]\n  box: world\n  depth: 5\n", encoding="utf-8")
    c = load_key_spec(p)
    assert isinstance(c, SpatialKeyCodec) and c.depth == 5
    (tmp_path / "tree.yaml").write_text("A: {a: [x, y]}\n", encoding="utf-8")
    h = key_codec_from_spec({"kind": "hierarchy", "columns": ["c", "r", "t"], "tree_file": "tree.yaml"},
                            base_dir=tmp_path)
    assert h.depth == 3 and h.fanout == 2
    with pytest.raises(KeySpecError, match=r"key kind \('words'\) must be one of"):
        key_codec_from_spec({"kind": "words"})
    with pytest.raises(KeySpecError, match=r"unknown fields for a text key: \['alpha'\]"):
        key_codec_from_spec({"kind": "text", "column": "q", "alpha": "ab"})
    with pytest.raises(KeySpecError, match=r"depth \(40\) must be an int in \[1, 30\]"):
        SpatialKeyCodec(columns=("a",), box=((0, 1),), depth=40)


# -- spatial coordinates: each value judged alone, like a declared numeric domain ---------------
ODD_COORDINATES = [
    "0.5", " 0.25 ", "0.75\xa0", "1e-1", "+0.5", ".5", "5.", "0x1", "1_0", "½", "١", "", "  ", "abc",
    "nan", "inf", "-inf", "1,5", "0.5e", "1 2", "\ud800", None, np.nan, pd.NA, pd.NaT, True, False,
    np.True_, 1, 0, 10**400, complex(0.5, 0), 1j, b"0.5", bytearray(b"0.5"), decimal.Decimal("0.5"),
    np.float32(0.5), np.int64(1), np.datetime64("2020-01-01"), [0.5], {"x": 1}, 0.5, float("inf"),
]
SPATIAL = SpatialKeyCodec(columns=("x", "y"), box=((0, 1), (0, 1)), depth=4)


def _spatial_rows(xs: list, ys: list) -> list:
    """Per row: its codes, or its dead-letter reason."""
    codes, bad = SPATIAL.encode({"x": pd.Series(xs, dtype=object), "y": pd.Series(ys, dtype=object)})
    reasons, kept = dict(bad), iter(codes.tolist())
    return [reasons[i] if i in reasons else next(kept) for i in range(len(xs))]


def _alone(i: int, j: int):
    return _spatial_rows([ODD_COORDINATES[i]], [ODD_COORDINATES[j]])[0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(ODD_COORDINATES) - 1),
                          st.integers(0, len(ODD_COORDINATES) - 1)), min_size=1, max_size=12))
def test_spatial_coordinates_encode_the_same_alone_as_among_others(pairs):
    """Before: pd.to_numeric on the whole block; 26 of 43x43 (x, 0.5) pairs encoded a value
    otherwise than alone and 85 raised (10**400: OverflowError, the run failed), 665 of 2000
    random mixes had such a value; JSON true was the coordinate 1.0."""
    got = _spatial_rows([ODD_COORDINATES[i] for i, _ in pairs], [ODD_COORDINATES[j] for _, j in pairs])
    assert got == [_alone(i, j) for i, j in pairs]


def test_spatial_coordinates_parse_like_declared_numeric_domains():
    y = ["0.5"] * len(ODD_COORDINATES)
    got = _spatial_rows(list(ODD_COORDINATES), y)
    number = parse_numbers(ODD_COORDINATES)
    accepted = [not isinstance(r, str) for r in got]
    assert accepted == (np.isfinite(number) & (number >= 0) & (number <= 1)).tolist()
    for v in (True, False, np.True_, complex(0.5, 0), 10**400, [0.5]):  # malformed, never a crash
        (reason,) = _spatial_rows([v], ["0.5"])
        assert reason.startswith("coordinate x ") and reason.endswith(" is missing or not a number")
    assert _spatial_rows(["0.75\xa0", 1, decimal.Decimal("0.5")], ["0.5"] * 3) == [
        [4, 2, 1, 1], [4, 2, 2, 2], [4, 1, 1, 1]]
    # typed (non-object) columns parse the same
    codes, bad = SPATIAL.encode({"x": pd.Series([0.5, np.nan]), "y": pd.Series([0.5, 0.5])})
    assert codes.tolist() == [[4, 1, 1, 1]] and [i for i, _ in bad] == [1]
