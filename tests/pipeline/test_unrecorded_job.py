"""A job whose spends reach no manifest says so (rule 3: every spend is in the manifest).

Found as a user (H31): a job with ``bs.Count`` and no ``bs.WriteManifest`` ran without a word, and
its spends were recorded nowhere. The warning is logged when the job is discarded or the
interpreter exits, unless ``bs.WriteManifest`` took the manifest or ``job.accountant.to_dict()`` was
read. Each case runs in a fresh interpreter (the test session turns the warning off).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import apache_beam as beam
    import beamsynth as bs
    schema = bs.load_schema({"name": "toy", "columns": [
        {"name": "sex", "type": "categorical", "domain": {"kind": "categorical", "values": ["F", "M"]}}]})
    job = bs.PrivacyJob(epsilon=1.0, seed=1, name="nightly")
    with beam.Pipeline() as p:
        private = p | beam.Create([{"sex": "F"}, {"sex": "M"}]) | job.private(schema)
        _ = private | bs.Count(epsilon=0.5)
        if MODE == "manifest":
            _ = p | bs.WriteManifest(job=job, path=OUT)
    if MODE == "to_dict":
        job.accountant.to_dict()
""")


def _stderr(mode: str, tmp_path) -> str:
    code = f"MODE = {mode!r}; OUT = {str(tmp_path / 'manifest.json')!r}\n" + SCRIPT
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stderr


@pytest.mark.parametrize("mode", ["none", "manifest", "to_dict"])
def test_a_job_without_a_manifest_warns(mode, tmp_path) -> None:
    err = _stderr(mode, tmp_path)
    warned = ("PrivacyJob 'nightly' spent ε=0.5, δ=0 in 1 step(s) (Count) but no bs.WriteManifest "
              "took its manifest") in err
    assert warned == (mode == "none"), err[-2000:]
    assert ("recorded nowhere" in err) == (mode == "none")
