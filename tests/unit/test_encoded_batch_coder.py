"""EncodedBatch's compact wire form: exact round trips through pickle and Beam's coders.

``EncodedBatch.__reduce__`` stores ``codes`` in the narrowest unsigned dtype that holds them
(shifted by the minimum when sentinels such as ``OUT_OF_DOMAIN`` make it negative) and restores the
original dtype, byte order and values; ``pids`` travel unchanged.
"""

from __future__ import annotations

import copy
import pickle

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.coders import coders, typecoders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beamsynth.schemas.domains import MALFORMED, OUT_OF_DOMAIN
from beamsynth.schemas.schema import EncodedBatch, _pack_codes

# (dtype, values): every boundary of the uint8/uint16/uint32 packing and of the fallback.
CASES = [
    (np.int32, [0, 255]),
    (np.int32, [0, 256]),
    (np.int32, [0, 65535]),
    (np.int32, [0, 65536]),
    (np.int32, [0, 2**31 - 1]),
    (np.int32, [-(2**31), 2**31 - 1]),
    (np.int32, [OUT_OF_DOMAIN, MALFORMED, 0, 253]),  # span 255: uint8
    (np.int32, [OUT_OF_DOMAIN, MALFORMED, 0, 254]),  # span 256: uint16
    (np.int32, [MALFORMED, 65533]),
    (np.int32, [MALFORMED, 65534]),
    (np.int64, [0, 255]),
    (np.int64, [0, 2**32 - 1]),
    (np.int64, [0, 2**32]),  # too wide: kept as int64
    (np.int64, [-(2**63), 2**63 - 1]),
    (np.int64, [-(2**63), -(2**63) + 2**32 - 1]),  # offset at the int64 minimum
    (np.int64, [MALFORMED, OUT_OF_DOMAIN]),
    (np.uint64, [0, 2**64 - 1]),
    (np.uint64, [2**63, 2**63 + 7]),
    (np.uint32, [0, 2**32 - 1]),
    (np.int16, [MALFORMED, 255]),
    (np.dtype(">u2"), [0, 255, 256, 65535]),  # prefix codes: big-endian symbols
    (np.dtype(">i4"), [OUT_OF_DOMAIN, 70000]),
    (np.uint8, [0, 255]),
    (np.int8, [-128, 127]),
]


def _batch(dtype: object, values: list[int], rows: int = 7, cols: int = 3) -> EncodedBatch:
    rng = np.random.default_rng(len(values))
    codes = np.array(values, dtype=dtype)[rng.integers(0, len(values), size=(rows, cols))]
    codes.flat[: len(values)] = values  # both extremes present
    return EncodedBatch(codes)


def _assert_same(got: EncodedBatch, want: EncodedBatch) -> None:
    assert type(got) is EncodedBatch
    assert got.codes.dtype == want.codes.dtype  # including byte order
    assert got.codes.dtype.str == want.codes.dtype.str
    assert got.codes.shape == want.codes.shape
    np.testing.assert_array_equal(got.codes, want.codes)
    assert got.codes.flags.c_contiguous and got.codes.flags.writeable
    if want.pids is None:
        assert got.pids is None
    else:
        assert got.pids.dtype == want.pids.dtype
        assert list(got.pids) == list(want.pids)


def _coders() -> list[coders.Coder]:
    return [
        typecoders.registry.get_coder(EncodedBatch),  # what Create infers for a batch
        typecoders.registry.get_coder(object),  # untyped DoFn outputs
        coders.FastPrimitivesCoder(),
        coders.PickleCoder(),
        coders.CloudpickleCoder(),
    ]


@pytest.mark.parametrize(("dtype", "values"), CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
def test_pickle_round_trip_exact(dtype: object, values: list[int], protocol: int) -> None:
    batch = _batch(dtype, values)
    _assert_same(pickle.loads(pickle.dumps(batch, protocol)), batch)


@pytest.mark.parametrize(("dtype", "values"), CASES, ids=lambda v: str(v))
def test_beam_coders_round_trip_exact(dtype: object, values: list[int]) -> None:
    batch = _batch(dtype, values)
    for coder in _coders():
        _assert_same(coder.decode(coder.encode(batch)), batch)


@pytest.mark.parametrize(
    ("values", "narrow"),
    [
        ([0, 255], "u1"),
        ([0, 256], "u2"),
        ([0, 65535], "u2"),
        ([0, 65536], "u4"),
        ([OUT_OF_DOMAIN, 254], "u1"),
        ([OUT_OF_DOMAIN, 255], "u2"),
        ([MALFORMED, 253], "u1"),
        ([MALFORMED, 254], "u2"),
        ([MALFORMED, 65534], "u4"),
    ],
)
def test_narrowest_unsigned_dtype(values: list[int], narrow: str) -> None:
    dtype, shape, offset, got, data = _pack_codes(np.array(values, dtype=np.int64))
    assert np.dtype(got) == np.dtype(narrow)
    assert offset == min(min(values), 0)
    assert len(data) == len(values) * np.dtype(narrow).itemsize
    assert (np.dtype(dtype), shape) == (np.dtype(np.int64), (len(values),))


@pytest.mark.parametrize(
    ("codes", "narrow"),
    [
        (np.array([1, 2], dtype=np.uint8), "|u1"),  # already one byte
        (np.array([-1, 2], dtype=np.int8), "|i1"),
        (np.array([0, 2**32], dtype=np.int64), "<i8"),  # span too wide for uint32
        (np.array([-1, 2**32 - 1], dtype=np.int64), "<i8"),
        (np.array([0, 2**63], dtype=np.uint64), "<u8"),
        (np.array([0, 2**32], dtype=">i8"), ">i8"),
    ],
)
def test_own_bytes_when_nothing_narrower(codes: np.ndarray, narrow: str) -> None:
    dtype, _, offset, got, data = _pack_codes(codes)
    assert (dtype, offset, got, data) == (codes.dtype.str, 0, narrow, codes.tobytes())


@pytest.mark.parametrize(
    "codes",
    [np.array([0.5, 1.5]), np.array([True, False]), [1, 2, 3]],
    ids=["float", "bool", "list"],
)
def test_non_integer_codes_kept_as_is(codes: object) -> None:
    packed = _pack_codes(codes)
    assert len(packed) == 1 and packed[0] is codes
    got = pickle.loads(pickle.dumps(EncodedBatch(codes)))  # type: ignore[arg-type]
    np.testing.assert_array_equal(got.codes, codes)
    assert type(got.codes) is type(codes)


@pytest.mark.parametrize("shape", [(0, 15), (0, 0), (0,), (3, 0)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.dtype(">u2")])
def test_empty_batches(shape: tuple[int, ...], dtype: object) -> None:
    batch = EncodedBatch(np.zeros(shape, dtype=dtype))
    _assert_same(pickle.loads(pickle.dumps(batch, pickle.HIGHEST_PROTOCOL)), batch)
    with_pids = EncodedBatch(np.zeros(shape, dtype=dtype), np.empty(shape[0], dtype=object))
    for coder in _coders():
        _assert_same(coder.decode(coder.encode(with_pids)), with_pids)


def test_pids_strings_survive() -> None:
    pids = np.array(["", "a", "ünïcode", "x" * 1000, "42"], dtype=object)
    batch = EncodedBatch(np.array([[0, 1], [2, 3], [4, 5], [OUT_OF_DOMAIN, 300], [7, 8]], np.int32), pids)
    for coder in _coders():
        _assert_same(coder.decode(coder.encode(batch)), batch)
    _assert_same(pickle.loads(pickle.dumps(batch)), batch)


def test_non_contiguous_codes() -> None:
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    for codes in (base[:, ::3], base.T, np.asfortranarray(base), base[::2]):
        batch = EncodedBatch(codes)
        _assert_same(pickle.loads(pickle.dumps(batch)), batch)


def test_wire_form_is_compact() -> None:
    codes = np.random.default_rng(0).integers(0, 42, size=(20_000, 15)).astype(np.int32)
    packed = len(pickle.dumps(EncodedBatch(codes), pickle.HIGHEST_PROTOCOL))
    assert packed < codes.size + 500  # one byte per code (was four)
    assert len(coders.FastPrimitivesCoder().encode(EncodedBatch(codes))) < codes.size + 500


def test_unpickled_codes_are_independent_and_copy_is_shallow() -> None:
    batch = EncodedBatch(np.array([[1, 2]], dtype=np.int32), np.array(["p"], dtype=object))
    back = pickle.loads(pickle.dumps(batch))
    back.codes[0, 0] = 9  # writable, and not a view of anything shared
    assert batch.codes[0, 0] == 1
    shallow = copy.copy(batch)
    assert shallow.codes is batch.codes and shallow.pids is batch.pids
    _assert_same(copy.deepcopy(batch), batch)


@pytest.mark.slow  # starts the 2-process runner (~12 s); tests/pipeline/test_runners.py runs it by default
def test_survives_reshuffle_on_multi_process_direct_runner() -> None:
    batches = [
        EncodedBatch(np.array([[0, 255], [256, 65535]], dtype=np.int32)),
        EncodedBatch(np.array([[OUT_OF_DOMAIN, MALFORMED], [65536, 7]], dtype=np.int64),
                     np.array(["a", "b"], dtype=object)),
        EncodedBatch(np.zeros((0, 2), dtype=np.int32), np.empty(0, dtype=object)),
        EncodedBatch(np.array([[1, 2]], dtype=">u2")),
    ]
    # a lambda (pickled by value) so that worker processes need not import this test module
    canonical = lambda b: (b.codes.dtype.str, b.codes.shape, b.codes.tolist(),  # noqa: E731
                           None if b.pids is None else tuple(b.pids))
    want = [canonical(b) for b in batches]
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    with BeamTestPipeline(options=options) as p:
        out = (p
               | "Batches" >> beam.Create(batches)  # EncodedBatch
               | "Shuffle" >> beam.Reshuffle()  # EncodedBatch, across worker processes
               | "Canonical" >> beam.Map(canonical))  # (dtype, shape, codes, pids)
        assert_that(out, equal_to(want), label="Unchanged")
