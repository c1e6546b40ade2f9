"""A release with both reports, the ``beamsynth report`` CLI, progress output, and rendering in
headless Chromium (images load, no console errors)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from beamsynth.pipelines.cli.main import main
from beamsynth.pipelines.releases.report import (
    PRIVATE_BANNER,
    cramers_v_matrix,
    discrete_laplace_interval,
)
from beamsynth.transforms.noise import discrete_laplace_cdf

ADULT = Path(__file__).resolve().parents[2] / "examples" / "data" / "adult" / "adult.csv"
_HAVE_REPORT_DEPS = all(importlib.util.find_spec(m) is not None for m in ("matplotlib", "sklearn"))
needs_adult = pytest.mark.skipif(not ADULT.exists(), reason="examples/data/adult/adult.csv absent")
needs_report_deps = pytest.mark.skipif(
    not _HAVE_REPORT_DEPS, reason="reports need matplotlib and scikit-learn (pip install '.[report]')")

CONFIG = """
name: small
folder: {root}/rel/small-{{date}}
budget: {{epsilon: 2.0}}
ledger: {{path: {root}/ledger.sqlite, policies: {{adult: {{epsilon: 10}}}}}}
seed: 3
demo: true
tables:
  - name: adult
    input: {data}
    schema: adult
    epsilon: 1.5
    formats: [csv, avro]
  - name: countries
    kind: histogram
    input: {data}
    schema: adult
    column: native-country
    tolerance: 0.01
    epsilon: 0.5
reports: {{target: income}}
"""

_CHECK = """<script>
window.__errs=[];
window.addEventListener('error',function(e){window.__errs.push(e.message||('failed to load '+
  String((e.target&&(e.target.src||e.target.href))||'').slice(0,60)))},true);
var __ce=console.error;console.error=function(){window.__errs.push([].join.call(arguments,' '));
  __ce.apply(console,arguments)};
window.addEventListener('load',function(){var im=[].slice.call(document.images);
  var bad=im.filter(function(i){return !(i.complete&&i.naturalWidth>0)}).length;
  var d=document.createElement('pre');d.id='__check';
  d.textContent=JSON.stringify({images:im.length,broken:bad,errors:window.__errs});
  document.body.appendChild(d)});
</script>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def render(html_path: Path, tmp_path: Path) -> dict:
    """Open a copy of the page (with an error/image probe in <head>) in headless Chromium."""
    browser = _chromium()
    probe = tmp_path / f"probe-{html_path.parent.name}-{html_path.name}"
    text = html_path.read_text(encoding="utf-8")
    probe.write_text(text.replace("<head>", "<head>" + _CHECK, 1), encoding="utf-8")
    profile = tmp_path / f"chromium-profile-{probe.stem}"
    out = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom",
         probe.as_uri()],
        capture_output=True, text=True, timeout=120)
    start = out.stdout.find('<pre id="__check">')
    assert start >= 0, f"chromium produced no probe result: {out.stderr[-2000:]}"
    body = out.stdout[start + len('<pre id="__check">'):out.stdout.index("</pre>", start)]
    return json.loads(body.replace("&quot;", '"').replace("&amp;", "&"))


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not ADULT.exists():
        pytest.skip("examples/data/adult/adult.csv absent")
    if not _HAVE_REPORT_DEPS:
        pytest.skip("reports need matplotlib and scikit-learn (pip install '.[report]')")
    root = tmp_path_factory.mktemp("release")
    lines = ADULT.read_text(encoding="utf-8").splitlines(keepends=True)[:601]
    data = root / "adult.csv"
    data.write_text("".join(lines), encoding="utf-8")
    cfg = root / "release.yaml"
    cfg.write_text(CONFIG.format(root=root, data=data), encoding="utf-8")
    assert main(["--quiet", "release", str(cfg), "--date", "2026-02-01"]) == 0
    return root / "rel" / "small-2026-02-01"


@needs_adult
@needs_report_deps
def test_release_folder_layout_and_private_boundary(release: Path) -> None:
    for rel in ("release.json", "public/adult.csv", "public/adult.avro", "public/adult.model.json",
                "public/report.html", "private/report.html", "private/adult.manifest.json",
                "private/adult.rejected.jsonl"):
        assert (release / rel).is_file(), rel
    doc = json.loads((release / "release.json").read_text(encoding="utf-8"))
    assert doc["demo"].startswith("DEMO RELEASE: seeded: not for release (seed 3)")
    assert "operational" not in json.dumps(doc)  # exact counts stay in private/
    assert doc["spent"]["epsilon"] == pytest.approx(2.0)
    private = (release / "private" / "report.html").read_text(encoding="utf-8")
    public = (release / "public" / "report.html").read_text(encoding="utf-8")
    assert PRIVATE_BANNER in private and "Train on synthetic, test on real" in private
    assert "TVD per marginal" in private and "Pairwise association" in private
    assert PRIVATE_BANNER not in public and "95% noise interval" in public
    assert "Released DP histogram" in public and (release / "public" / "countries.csv").is_file()
    assert "rows_read" not in public
    manifest = json.loads((release / "private" / "adult.manifest.json").read_text(encoding="utf-8"))
    op = manifest["operational"]
    assert op["rows_read"] == 600 and op["rows_used"] + op["rows_rejected"] == 600


@needs_adult
@needs_report_deps
def test_report_cli_for_any_pair(release: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    code = main(["--quiet", "report", "--real", str(release.parent.parent / "adult.csv"),
                 "--synthetic", str(release / "public" / "adult.avro"), "--schema", "adult",
                 "--output", str(out), "--target", "income"])
    assert code == 0
    text = out.read_text(encoding="utf-8")
    assert PRIVATE_BANNER in text and text.count("data:image/png;base64,") >= 15
    assert main(["--quiet", "report", "--real", str(tmp_path / "none.csv"), "--synthetic",
                 str(out), "--schema", "adult", "--output", str(out)]) == 2


@needs_adult
def test_progress_is_shown_and_quiet_silences_it(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    lines = ADULT.read_text(encoding="utf-8").splitlines(keepends=True)[:201]
    data = tmp_path / "adult.csv"
    data.write_text("".join(lines), encoding="utf-8")
    cfg = tmp_path / "release.yaml"
    cfg.write_text(CONFIG.format(root=tmp_path, data=data).replace("reports: {target: income}",
                                                                   "reports: {private: false, public: false}"),
                   encoding="utf-8")
    assert main(["release", str(cfg), "--date", "2026-02-02"]) == 0
    err = capfd.readouterr().err
    assert "reserved ε=2" in err and "CatHist of native-country" in err and "adult: rows used 200" in err and "published" in err
    assert main(["release", str(cfg), "--date", "2026-02-03", "--quiet"]) == 0
    assert capfd.readouterr().err == ""


@needs_adult
@pytest.mark.skipif(_chromium() is None,
                    reason="headless Chromium not installed (Debian: apt-get install chromium chromium-driver)")
@needs_report_deps
def test_reports_render_in_headless_chromium(release: Path, tmp_path: Path) -> None:
    for which in ("private", "public"):
        result = render(release / which / "report.html", tmp_path)
        assert result["errors"] == [], which
        assert result["broken"] == 0 and result["images"] >= 15, (which, result)


@pytest.mark.skipif(_chromium() is None,
                    reason="headless Chromium not installed (Debian: apt-get install chromium chromium-driver)")
def test_the_render_probe_catches_broken_images_and_console_errors(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><head></head><body><img src="missing.png">'
                    '<script>console.error("boom")</script></body></html>', encoding="utf-8")
    result = render(page, tmp_path)
    assert result["broken"] == 1 and "boom" in result["errors"]


def test_noise_interval_matches_the_discrete_laplace_law() -> None:
    for scale in (0.3, 1.0, 20.0, 123.4):
        t = discrete_laplace_interval(scale)
        inside = lambda k, b=scale: float(discrete_laplace_cdf(k, b) - discrete_laplace_cdf(-k - 1, b))  # noqa: E731
        assert inside(t) >= 0.95 > (inside(t - 1) if t > 0 else 0.0)
    with pytest.raises(ValueError, match=r"scale \(0\) must be a finite number > 0"):
        discrete_laplace_interval(0)


def test_cramers_v_of_copies_and_of_independent_columns() -> None:
    gen = np.random.default_rng(0)  # test data only
    a = gen.integers(0, 4, 5000)
    codes = np.stack([a, a, gen.integers(0, 3, 5000)], axis=1)
    v = cramers_v_matrix(codes, (4, 4, 3))
    assert v[0, 1] == pytest.approx(1.0) and v[0, 2] < 0.05 and v[0, 0] == 0



@needs_report_deps
def test_network_is_drawn_from_edges_or_privbayes_structure() -> None:
    from beamsynth.pipelines.releases.report import _network

    assert _network({"model": "independent marginals"}, ["a", "b"]) is None
    for desc in ({"edges": [["a", "b"]]}, {"structure": [["a", []], ["b", ["a"]]]}):
        img = _network(desc, ["a", "b"])
        assert img is not None and img.startswith('<img alt="plot" src="data:image/png;base64,')


def test_public_report_reads_declared_noise_scales() -> None:
    from beamsynth.pipelines.releases.report import _spend_rows

    rows = _spend_rows([
        {"step": "row_count", "mechanism": "discrete Laplace", "epsilon": 0.1, "delta": 0,
         "details": {"scale": 10.0}},
        {"step": "m", "mechanism": "discrete Laplace on marginals", "epsilon": 1, "delta": 0,
         "details": {"scale_per_cell": 8.5, "penalty_scale": 3.0}},
        {"step": "s", "mechanism": "exponential mechanism", "epsilon": 1, "delta": 0, "details": {}},
    ])
    assert rows[0][4:] == ["10", f"±{discrete_laplace_interval(10.0)}"]
    assert rows[1][4] == "8.5" and rows[2][4:] == ["", ""]


@pytest.mark.slow
@needs_adult
@needs_report_deps
def test_example_adult_release_from_the_readme(tmp_path: Path) -> None:
    """``beamsynth release examples/release_adult.yaml`` on all 48,842 rows (folder/ledger moved)."""
    import yaml

    example = ADULT.parents[2] / "release_adult.yaml"
    data = yaml.safe_load(example.read_text(encoding="utf-8"))
    data["folder"] = str(tmp_path / "adult-{date}")
    data["ledger"]["path"] = str(tmp_path / "ledger.sqlite")
    data["tables"][0]["input"] = str(ADULT)
    cfg = tmp_path / "release_adult.yaml"
    cfg.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert main(["--quiet", "release", str(cfg), "--date", "2026-03-01"]) == 0
    folder = tmp_path / "adult-2026-03-01"
    for rel in ("release.json", "public/adult.csv", "public/adult.parquet", "public/report.html",
                "private/report.html"):
        assert (folder / rel).is_file(), rel
    manifest = json.loads((folder / "private" / "adult.manifest.json").read_text(encoding="utf-8"))
    assert manifest["operational"]["rows_read"] == 48842


def test_public_report_states_per_record_and_dataset_guarantees_side_by_side() -> None:
    """Issue 18: a plausible-deniability release's public report shows the manifest's
    ``release_guarantee.side_by_side`` (per released record next to the dataset-level C·ε₁)."""
    from beamsynth.pipelines.releases.report import public_report_html

    side = [{"level": "per released record (Theorem 1)", "epsilon": 1.1484200051182734, "delta": 1.39e-11,
             "neighbours": "add/remove one record of D_S"},
            {"level": "dataset: every candidate (C·ε₁, C·δ₁ + δ_tail), charged", "epsilon": 3777.153396834001,
             "delta": 1.4567e-07, "neighbours": "add/remove one record of D_S"}]
    tab = {"method": "plausible", "source": "s", "privacy_unit": None, "rows_out": 10, "randomness": "secure",
           "budget": {"spends": []}, "details": {"method": {"release_guarantee": {"side_by_side": side}}}}
    release = {"name": "r", "budget": {"epsilon": 3778.2, "delta": 1e-6},
               "spent": {"epsilon": 3778.2, "delta": 1.5e-7}, "tables": {"t": tab}}
    page = public_report_html(release, {}, {})
    assert "Guarantee per released record and for the whole release" in page
    assert "<td>1.14842</td>" in page and "<td>3777.15</td>" in page and "per released record (Theorem 1)" in page
    tab["details"] = {"method": {"k": 50}}
    assert "Guarantee per released record" not in public_report_html(release, {}, {})
