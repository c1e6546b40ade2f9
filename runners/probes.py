"""Runner capability probes: tiny pipelines whose correct output is known.

Beam's DaskRunner (apache-beam 2.77) runs some primitives silently wrong. Each probe below
builds the smallest pipeline showing one such gap and writes its output lines into a folder;
:func:`check_runner` runs them all on given options and reports which ones a runner gets wrong::

    python -m beamsynth.runners.probes --runner dask --dask_client_address tcp://host:8786

The tests (``tests/pipeline/test_runners.py``) run every probe on the DirectRunner (all correct)
and on a local Dask cluster (the documented gaps, see ``docs/runners.md``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import window as beam_window
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

__all__ = [
    "PROBES",
    "AppendToFolderFn",
    "EmitInFinishBundleFn",
    "EvenOddFn",
    "check_runner",
    "read_folder",
]


class AppendToFolderFn(beam.DoFn):
    """Appends ``str(element)`` lines to a file of its own in ``folder`` (a test sink that needs
    neither ``finish_bundle`` output nor a Beam file sink)."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._path: str | None = None

    def setup(self) -> None:
        self._path = os.path.join(self._folder, f"{os.getpid()}-{uuid.uuid4().hex}.txt")

    def process(self, element: Any) -> Iterable[Any]:
        with open(self._path, "a", encoding="utf-8") as fh:  # type: ignore[arg-type]
            fh.write(f"{element}\n")
        return ()


class EvenOddFn(beam.DoFn):
    """Even numbers on the main output, odd ones on the ``odd`` output."""

    def process(self, x: int) -> Iterable[Any]:
        yield x if x % 2 == 0 else beam.pvalue.TaggedOutput("odd", x)


class EmitInFinishBundleFn(beam.DoFn):
    """Buffers a bundle and emits it from ``finish_bundle`` (what ``BatchElements`` does)."""

    def start_bundle(self) -> None:
        self._buffer: list[Any] = []

    def process(self, x: Any) -> Iterable[Any]:
        self._buffer.append(x)
        return ()

    def finish_bundle(self) -> Iterable[WindowedValue]:
        for x in self._buffer:
            yield WindowedValue(x, GlobalWindow().max_timestamp(), [GlobalWindow()])


def read_folder(folder: str | Path) -> list[str]:
    """Sorted lines of every file in ``folder``."""
    return sorted(line for f in Path(folder).iterdir() for line in f.read_text().splitlines())


def _sink(pcoll: beam.PCollection, folder: str, label: str) -> beam.PCollection:
    return pcoll | label >> beam.ParDo(AppendToFolderFn(folder))


def _multi_output(p: beam.Pipeline, folder: str) -> None:
    outs = p | beam.Create(list(range(6))) | beam.ParDo(EvenOddFn()).with_outputs("odd", main="even")
    _sink(outs.even, folder, "Even")


def _finish_bundle(p: beam.Pipeline, folder: str) -> None:
    _sink(p | beam.Create(list(range(3))) | beam.ParDo(EmitInFinishBundleFn()), folder, "Out")


def _two_sinks(p: beam.Pipeline, folder: str) -> None:
    for tag in ("a", "b"):
        _sink(p | f"Create{tag}" >> beam.Create([tag]), folder, f"Write{tag}")


def _format_side(x: int, side: list[int]) -> str:
    return f"main {x} side {sorted(side)}"


def _side_input_after_gbk(p: beam.Pipeline, folder: str) -> None:
    sums = (p | beam.Create([(0, i) for i in range(4)]) | beam.GroupByKey()
            | "Sum" >> beam.Map(lambda kv: sum(kv[1])))
    # [6]
    main = sums | "Fan" >> beam.FlatMap(lambda _s: [1, 2])
    _sink(main | beam.Map(_format_side, beam.pvalue.AsList(sums)), folder, "Out")


def _windows(p: beam.Pipeline, folder: str) -> None:
    day = 86_400
    sums = (p | beam.Create([1, 2, day + 1, 2 * day])
            | beam.Map(lambda x: beam_window.TimestampedValue(x, x))
            | beam.WindowInto(beam_window.FixedWindows(day))
            | beam.CombineGlobally(sum).without_defaults())
    _sink(sums, folder, "Out")


# name → (builder(p, folder), correct sorted output lines)
PROBES: dict[str, tuple[Callable[[beam.Pipeline, str], None], list[str]]] = {
    "multi-output ParDo: the main output gets only main elements": (_multi_output, ["0", "2", "4"]),
    "finish_bundle output reaches the next step": (_finish_bundle, ["0", "1", "2"]),
    "every sink runs": (_two_sinks, ["a", "b"]),
    "a side input sharing an upstream GroupByKey with the main input is correct": (
        _side_input_after_gbk, ["main 1 side [6]", "main 2 side [6]"]),
    "FixedWindows: one combine result per window": (_windows, ["172800", "3", "86401"]),
}


def run_probe(name: str, options: PipelineOptions, folder: str | Path) -> list[str]:
    """Run probe ``name`` with ``options``; its output lines (sorted)."""
    build, _ = PROBES[name]
    p = beam.Pipeline(options=options)
    build(p, str(folder))
    p.run().wait_until_finish()
    return read_folder(folder)


def check_runner(options: PipelineOptions) -> dict[str, tuple[bool, list[str]]]:
    """``{probe: (correct, output)}`` for every probe on the runner ``options`` select."""
    out = {}
    for name, (_, expected) in PROBES.items():
        with tempfile.TemporaryDirectory() as folder:
            got = run_probe(name, options, folder)
        out[name] = (got == expected, got)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print which probes a runner gets right (arguments: Beam options or a preset)."""
    from beamsynth.runners.presets import options_for

    for name, (ok, got) in check_runner(options_for(sys.argv[1:] if argv is None else argv)).items():
        print(f"{'ok  ' if ok else 'WRONG'} {name}" + ("" if ok else f": got {got}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
