"""Beam's bounded ``Read`` on beamsynth's DaskRunner: the DirectRunner's elements, split by the
source itself.

Beam's DaskRunner replaced every ``Read`` with a primitive it never translated: ``ReadFromText``,
``ReadFromParquet``, ``ReadFromParquetBatched`` and ``ReadFromAvro`` gave an empty collection
(0 rows against 1,949 lines on the DirectRunner), and 43f3e33 refused them. Now a ``Read`` of a
``BoundedSource`` is split with the source's own ``split(desired_bundle_size)`` (the desired size
from the estimated bytes and the partitions), each split read in its own partition by the root
ParDo of a fused stage. The cluster tests run each pipeline on the DirectRunner and on a 2-worker
LocalCluster (``--dask_npartitions=5``, so small files are split inside); the others translate
on dask's synchronous scheduler or refuse when built, without a cluster.
"""

from __future__ import annotations

import gzip
import json
import weakref
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.io import iobase, range_trackers
from apache_beam.testing import test_stream
from apache_beam.transforms.periodicsequence import PeriodicImpulse

import beamsynth as bs

pytest.importorskip("dask.bag", reason="pip install 'beamsynth[dask]'")

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"
SPLIT = ["--dask_npartitions=5"]  # small files split inside (the default floor is 1 MiB)


def _lines(build, args: list[str], folder: Path) -> list[str]:
    """``build(p)`` → a PCollection of str, run with ``args``, its lines sorted."""
    folder.mkdir()
    with beam.Pipeline(options=bs.pipeline_options(args)) as p:
        _ = build(p) | beam.io.WriteToText(str(folder / "out"), shard_name_template="")
    return sorted((folder / "out").read_text(encoding="utf-8").splitlines())


def _both(build, tmp_path: Path, dask_address: str, extra: list[str] = SPLIT) -> list[str]:
    """The lines on the DirectRunner, checked equal (as a multiset) to the DaskRunner's."""
    run = len(list(tmp_path.glob("direct*")))
    direct = _lines(build, [], tmp_path / f"direct{run}")
    dask = _lines(build, ["--runner", "dask", f"--dask_client_address={dask_address}", *extra],
                  tmp_path / f"dask{run}")
    assert len(dask) == len(direct) and dask == direct
    return direct


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


# -- on a 2-worker LocalCluster -----------------------------------------------------------------
def test_read_from_text_plain_gz_and_glob(tmp_path, dask_address):
    """A plain file split inside, a .gz (one split: not splittable) and a glob of several files
    with an empty one, with and without a header line skipped per file."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("".join(f"a{i},{i * i}\n" for i in range(3000)), encoding="utf-8")
    with gzip.open(data / "b.txt.gz", "wt", encoding="utf-8") as fh:
        fh.write("".join(f"b{i}\n" for i in range(700)))
    (data / "c.txt").write_text("head\n" + "".join(f"c{i}\n" for i in range(40)), encoding="utf-8")
    (data / "d.txt").write_text("", encoding="utf-8")
    plain = _both(lambda p: p | beam.io.ReadFromText(str(data / "a.txt")), tmp_path, dask_address)
    assert len(plain) == 3000 and len(set(plain)) == 3000
    gz = _both(lambda p: p | beam.io.ReadFromText(str(data / "b.txt.gz")), tmp_path, dask_address)
    assert len(gz) == 700
    glob = _both(lambda p: p | beam.io.ReadFromText(str(data / "*.txt*")), tmp_path, dask_address)
    assert len(glob) == 3000 + 700 + 41
    headless = _both(lambda p: p | beam.io.ReadFromText(str(data / "*.txt*"), skip_header_lines=1),
                     tmp_path, dask_address, extra=[])  # the default split: one per small file
    assert len(headless) == 3000 + 700 + 41 - 3 and "head" not in headless


def test_empty_file(tmp_path, dask_address):
    """An empty file: no element, no crash (Beam's concat source skips it: no split at all)."""
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert _both(lambda p: p | beam.io.ReadFromText(str(empty)), tmp_path, dask_address) == []


def test_read_from_parquet_rows_and_batches(tmp_path, dask_address):
    """12 row groups of 50 rows (nulls included): rows as Beam Rows (the Arrow table → rows step
    yields batches, exploded on dask as on Beam's workers), and one Arrow table per row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    table = pa.table({"id": list(range(600)), "city": [["Oslo", "Rome", None][i % 3] for i in range(600)],
                      "score": [i / 7 for i in range(600)]})
    pq.write_table(table, path, row_group_size=50)
    assert pq.ParquetFile(path).num_row_groups == 12
    rows = _both(lambda p: (p | beam.io.ReadFromParquet(str(path), as_rows=True)
                            | beam.Map(lambda r: _json(r._asdict()))), tmp_path, dask_address)
    assert rows == sorted(_json(r) for r in table.to_pylist())
    tables = _both(lambda p: (p | beam.io.ReadFromParquetBatched(str(path))
                              | beam.Map(lambda t: _json(t.to_pylist()))), tmp_path, dask_address)
    assert len(tables) == 12


def test_read_from_avro(tmp_path, dask_address):
    """An Avro file of many sync blocks, split by byte range: the same records as direct."""
    import fastavro

    path = tmp_path / "in.avro"
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "id", "type": "long"}, {"name": "city", "type": ["null", "string"]}]}
    records = [{"id": i, "city": None if i % 5 == 0 else f"c{i % 17}"} for i in range(2000)]
    with open(path, "wb") as fh:
        fastavro.writer(fh, fastavro.parse_schema(schema), records, sync_interval=500)
    got = _both(lambda p: p | beam.io.ReadFromAvro(str(path)) | beam.Map(_json), tmp_path,
                dask_address)
    assert got == sorted(_json(r) for r in records)


def test_read_of_a_bounded_source_generally(tmp_path, dask_address):
    """``beam.io.Read(source)`` of a BoundedSource that is not a file (Beam's Create source, which
    splits by element): the same elements."""
    from apache_beam import coders
    from apache_beam.transforms.create_source import _CreateSource

    coder = coders.VarIntCoder()
    source = _CreateSource([coder.encode(i) for i in range(500)], coder)
    got = _both(lambda p: p | beam.io.Read(source) | beam.Map(str), tmp_path, dask_address)
    assert got == sorted(str(i) for i in range(500))


def _seeded_job(args: list[str], src: Path, folder: Path) -> dict[str, bytes]:
    """ReadFromText → dicts → job.private → bs.Count + bs.Synthesize, seeded; each output one
    file of sorted JSON lines (a Beam sink's line order is the runner's), and the manifest."""
    folder.mkdir()
    header = src.read_text(encoding="utf-8").splitlines()[0].split(",")
    job = bs.PrivacyJob(epsilon=2.0, seed=11)
    with beam.Pipeline(options=bs.pipeline_options(args)) as p:
        dicts = (p | "Read" >> beam.io.ReadFromText(str(src), skip_header_lines=1)
                 | "Parse" >> beam.Map(lambda line: dict(zip(header, line.split(",")))))
        private = dicts | job.private(bs.load_schema("adult"))
        outputs = {"bad": private.dead_letters,
                   "count": private | bs.Count(epsilon=0.5),
                   "synthetic": private | bs.Synthesize(epsilon=1.0, rows=300)}
        for name, rows in outputs.items():
            _ = (rows | f"Json[{name}]" >> beam.Map(lambda r: _json(r._asdict()))
                 | f"All[{name}]" >> beam.combiners.ToList()
                 | f"Sorted[{name}]" >> beam.Map(lambda lines: "\n".join(sorted(lines)))
                 | f"Write[{name}]" >> beam.io.WriteToText(str(folder / name), shard_name_template=""))
        _ = p | bs.WriteManifest(job=job, path=str(folder / "manifest.json"))
    files = {name: (folder / name).read_bytes() for name in outputs}
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    files["sources"] = _json(manifest["operational"]["sources"]).encode()
    release = manifest["release"]
    release["outputs"] = {k: Path(v).name for k, v in release["outputs"].items()}  # own folders
    files["release"] = _json(release).encode()
    return files


def test_seeded_job_through_read_from_text_is_byte_identical(tmp_path, dask_address):
    """2,000 Adult rows (one malformed) read by ReadFromText in 5 splits: the same bytes of
    dead letters, DP count and synthetic rows, and the same manifest counts, as direct."""
    if not ADULT.exists():
        pytest.skip(f"{ADULT} absent")
    src = tmp_path / "adult.csv"
    lines = ADULT.read_text(encoding="utf-8").splitlines()[:2001]
    lines[7] = "abc," + lines[7].split(",", 1)[1]  # age 'abc': a dead letter
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    direct = _seeded_job([], src, tmp_path / "direct")
    dask = _seeded_job(["--runner", "dask", f"--dask_client_address={dask_address}", *SPLIT], src,
                       tmp_path / "dask")
    assert dask == direct
    assert len(direct["synthetic"].splitlines()) == 300 and len(direct["bad"].splitlines()) == 1
    assert json.loads(direct["sources"])["MakePrivate(adult)"]["read"] == 2000


# -- no cluster: translation and refusals ------------------------------------------------------
class _Blob:
    """A large element stand-in; ``registry`` (a WeakSet) holds the live blobs of one read."""

    def __init__(self, registry: weakref.WeakSet) -> None:
        self.registry = registry
        registry.add(self)


class _BlobSource(iobase.BoundedSource):
    """``n`` blobs, positions 0..n-1, split by position (the test's stand-in for a big file)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def estimate_size(self) -> int:
        return self.n

    def split(self, desired_bundle_size, start_position=None, stop_position=None):
        start, stop = start_position or 0, self.n if stop_position is None else stop_position
        for s in range(start, stop, desired_bundle_size):
            yield iobase.SourceBundle(1, self, s, min(stop, s + desired_bundle_size))

    def get_range_tracker(self, start_position, stop_position):
        return range_trackers.OffsetRangeTracker(start_position or 0,
                                                 self.n if stop_position is None else stop_position)

    def read(self, range_tracker):
        registry: weakref.WeakSet = weakref.WeakSet()
        position = range_tracker.start_position()
        while range_tracker.try_claim(position):
            yield _Blob(registry)
            position += 1


def _live(blob: _Blob) -> int:
    return len(blob.registry)


def _translate(p: beam.Pipeline, **bag_kwargs):
    from beamsynth.runners.dask_runner import _BagVisitor, _overrides, _ReadersVisitor

    p.replace_all(_overrides())
    readers = _ReadersVisitor()
    p.visit(readers)
    visitor = _BagVisitor(bag_kwargs, readers.readers, readers.stages, 8)
    p.visit(visitor)
    return visitor


def test_a_split_streams_through_the_read_stage():
    """A source of 120 blobs read in 3 splits on 3 partitions: each blob goes through the steps
    after the read before the next is read (at most a few alive), never a list of the split."""
    import dask

    p = beam.Pipeline()
    live = p | beam.io.Read(_BlobSource(120)) | "Live" >> beam.Map(_live)
    _ = (live, p | "None" >> beam.Create([])) | beam.Flatten()  # "Live"'s output leaves the stage
    visitor = _translate(p, npartitions=3)
    with dask.config.set(scheduler="sync"):
        got = [wv.value for wv in visitor.bags[live].compute()]
    assert len(got) == 120 and visitor.bags[live].npartitions == 3
    assert max(got) <= 3, f"{max(got)} blobs alive at once: the read does not stream"


def test_splits_follow_the_estimated_bytes_and_the_partitions(tmp_path):
    """Desired split = estimated bytes / partitions (cluster cap 8, or --dask_npartitions), at
    least 1 MiB by default; a file is at least one split and a .gz exactly one; more splits than
    partitions are dealt contiguously, each partition reading its splits one after the other."""
    from beamsynth.runners.dask_runner import _BagVisitor, _deal_parts

    big = tmp_path / "big.txt"
    big.write_bytes((b"y" * 99 + b"\n") * 40_000)  # 4,000,000 bytes
    source = beam.io.ReadFromText(str(big))._source
    splits, partitions = _BagVisitor({}, {}, {}, 8)._read_parts(source)
    assert (len(splits), partitions) == (4, 8)  # 500,000 B wanted, 1 MiB floor: 4 splits
    splits, partitions = _BagVisitor({"npartitions": 5}, {}, {}, 8)._read_parts(source)
    assert (len(splits), partitions) == (5, 5)
    assert [s.stop_position - s.start_position for s in splits] == [800_000] * 5
    for i in range(12):
        (tmp_path / f"small{i}.txt").write_text("z\n", encoding="utf-8")
    with gzip.open(tmp_path / "small.txt.gz", "wt") as fh:
        fh.write("z\n" * 100_000)
    many = beam.io.ReadFromText(str(tmp_path / "small*"))._source
    splits, partitions = _BagVisitor({"npartitions": 5}, {}, {}, 8)._read_parts(many)
    assert len(splits) == 13 and partitions == 5
    assert [len(part) for part in _deal_parts(splits, partitions)] == [2, 3, 2, 3, 3]
    assert _deal_parts([], 8) == [[]]


def test_impulse_is_one_element():
    """Beam's Impulse (a ``Create`` subclass, a ``Read`` of a PTransform source) is one empty
    bytes element; it was an empty bag like the Read."""
    import dask

    p = beam.Pipeline()
    sizes = p | beam.Impulse() | "Len" >> beam.Map(len)
    _ = (sizes, p | "None" >> beam.Create([])) | beam.Flatten()
    visitor = _translate(p)
    with dask.config.set(scheduler="sync"):
        assert [wv.value for wv in visitor.bags[sizes].compute()] == [0]


@pytest.mark.parametrize("make, expected", [
    (lambda p: (p | beam.Create([_BlobSource(3)]) | iobase.SDFBoundedSourceReader()),
     "is a splittable DoFn (SDF"),
    (lambda p: p | PeriodicImpulse(0, 10, 1),
     "its output is unbounded"),
    (lambda p: p | test_stream.TestStream().add_elements(["a"]),
     "its output is unbounded"),
], ids=["sdf", "periodic-impulse", "test-stream"])
def test_unbounded_and_sdf_reads_are_refused_when_built(make, expected):
    """Nothing runs and no cluster starts: the refusal names the step and the way out."""
    pytest.importorskip("distributed")
    with pytest.raises(NotImplementedError) as err:
        with beam.Pipeline(options=bs.pipeline_options(["--runner", "dask"])) as p:
            _ = make(p) | beam.Map(str)
    message = str(err.value)
    assert message.startswith("the dask runner cannot run step ") and expected in message
    assert "ReadFromText, ReadFromParquet, ReadFromAvro" in message
