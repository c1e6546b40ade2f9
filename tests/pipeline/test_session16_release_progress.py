"""Sixteenth session (lead): `beamsynth release` tells what its report step does.

H79's CLI pass measured 16-46 s of "writing reports" without a further line (PNG plots 8.7 s and
the ML-efficacy models 8.2 s of 21 s); each report part now has its own progress line, and
``--quiet`` still prints nothing."""
from __future__ import annotations

import pytest

from beamsynth.pipelines.cli.main import main
from tests.pipeline.test_release_reports import ADULT, CONFIG, needs_adult, needs_report_deps


@pytest.mark.slow  # two releases with reports: 27 s at load 8
@needs_adult
@needs_report_deps
def test_release_report_parts_are_announced(tmp_path, capfd: pytest.CaptureFixture) -> None:
    lines = ADULT.read_text(encoding="utf-8").splitlines(keepends=True)[:201]
    data = tmp_path / "adult.csv"
    data.write_text("".join(lines), encoding="utf-8")
    cfg = tmp_path / "release.yaml"
    cfg.write_text(CONFIG.format(root=tmp_path, data=data), encoding="utf-8")
    assert main(["release", str(cfg), "--date", "2026-02-02"]) == 0
    err = capfd.readouterr().err
    assert "public report: plots of 2 table(s)" in err
    assert "private report of table adult: fidelity and ML efficacy" in err
    assert err.index("writing reports") < err.index("public report") < err.index("published")
    assert main(["release", str(cfg), "--date", "2026-02-03", "--quiet"]) == 0
    assert capfd.readouterr().err == ""
