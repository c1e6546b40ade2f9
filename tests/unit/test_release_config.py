"""Release configs are validated before any data is read, with the YAML path of each problem."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import yaml

from beamsynth.pipelines.releases.config import (
    RELEASE_CONFIG_SCHEMA,
    ReleaseConfigError,
    load_release_config,
)
from beamsynth.pipelines.releases.release import plan_release

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "release_adult.yaml"


def _base(tmp_path: Path) -> dict:
    data = tmp_path / "in.csv"
    data.write_text("age,sex\n30,Male\n", encoding="utf-8")
    return {
        "name": "t",
        "folder": str(tmp_path / "rel-{date}"),
        "budget": {"epsilon": 1.0},
        "ledger": {"path": str(tmp_path / "l.sqlite"), "policies": {"src": {"epsilon": 5.0}}},
        "tables": [{"name": "a", "source": "src", "input": str(data), "schema": "adult",
                    "epsilon": 0.6, "columns": ["age", "sex"]}],
        "reports": {"private": False, "public": False},
    }


def _error(cfg: dict) -> str:
    with pytest.raises(ReleaseConfigError) as info:
        load_release_config(cfg, date="2026-01-01")
    return str(info.value)


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/release_adult.yaml not in this checkout")
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("matplotlib", "sklearn")),
                    reason="the example's reports need matplotlib and scikit-learn ('.[report]')")
def test_example_release_config_validates_and_plans() -> None:
    cfg = load_release_config(EXAMPLE, date="2026-01-02")
    assert cfg.folder.endswith("adult-2026-01-02")
    plan = plan_release(cfg)
    assert sum(s.epsilon for s in plan.spends) == pytest.approx(1.0)
    assert {s.source for s in plan.spends} == {"adult"}


def test_valid_config_fills_date_and_selects_columns(tmp_path: Path) -> None:
    cfg = load_release_config(_base(tmp_path), date="2026-01-01")
    assert cfg.folder == str(tmp_path / "rel-2026-01-01")
    assert cfg.tables[0].schema.names == ["age", "sex"]
    assert cfg.tables[0].privacy_unit == "record"


@pytest.mark.parametrize(
    ("edit", "path", "message"),
    [
        (lambda c: c.update(colour=1), "colour", "unknown key"),
        (lambda c: c.update(seed=3), "seed", "allowed only with 'demo: true'"),
        (lambda c: c.update(demo="yes"), "demo", "must be true or false"),
        (lambda c: c["tables"][0].update(colour=1), "tables[0].colour", "unknown key"),
        (lambda c: c["budget"].update(epsilon=-1), "budget.epsilon", "(-1) must be in (0, ∞)"),
        (lambda c: c["tables"][0].update(epsilon=1.5), "tables[0].epsilon",
         "(1.5) overspends budget.epsilon (1)"),
        (lambda c: c["tables"].append(dict(c["tables"][0], name="b")), "tables[1].epsilon",
         "(0.6) overspends budget.epsilon (1): earlier tables already take ε=0.6, 0.4 remains"),
        (lambda c: c["tables"][0].update(columns={"age": {"epsilon": 0.1}}),
         "tables[0].columns.age.epsilon", "method 'independent' takes no per-column option 'epsilon'"),
        (lambda c: c["tables"][0].update(columns=["age", "shoe"]), "tables[0].columns[1]",
         "('shoe') is not a column"),
        (lambda c: c["tables"][0].update(formats=["csv", "xls"]), "tables[0].formats[1]",
         "('xls') must be one of"),
        (lambda c: c["tables"][0].update(method="magic"), "tables[0].method", "unknown method 'magic'"),
        (lambda c: c["tables"][0].update(source="other"), "tables[0].source",
         "('other') has no policy"),
        (lambda c: c["tables"][0].update(input="/nonexistent/*.csv"), "tables[0].input", "no file matches"),
        (lambda c: c["tables"][0].update(schema={"columns": [{"name": "age", "type": "integer"}]}),
         "tables[0].schema", "domain"),
        (lambda c: c["ledger"]["policies"]["src"].update(window_days=0),
         "ledger.policies.src.window_days", "(0) must be in (0, ∞)"),
        (lambda c: c.pop("ledger"), "ledger", "is required"),
        (lambda c: c["tables"][0].update(privacy_unit={"max_contributions": 3}),
         "tables[0].privacy_unit.max_contributions", "needs a privacy_id"),
        (lambda c: c["reports"].update(target="income"), "reports.target", "('income') is not a column"),
        (lambda c: c.update(folder="x-{night}"), "folder", "may use only {name} and {date}"),
    ],
)
def test_problems_are_reported_with_their_yaml_path(tmp_path: Path, edit, path: str, message: str) -> None:
    cfg = copy.deepcopy(_base(tmp_path))
    edit(cfg)
    text = _error(cfg)
    assert text.startswith(f"{path}: "), text
    assert message in text, text


def test_method_overspend_is_reported_at_plan_time(tmp_path: Path) -> None:
    cfg = _base(tmp_path)
    cfg["tables"][0]["count_fraction"] = 1.0
    assert _error(cfg).startswith("tables[0].count_fraction: ")


def test_config_file_errors_and_relative_paths(tmp_path: Path) -> None:
    cfg = _base(tmp_path)
    cfg["tables"][0]["input"] = "in.csv"  # relative to the config file
    path = tmp_path / "release.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    loaded = load_release_config(path, date="2026-01-01")
    assert loaded.tables[0].inputs == (str(tmp_path / "in.csv"),)
    path.write_text("name: [unclosed", encoding="utf-8")
    with pytest.raises(ReleaseConfigError, match="not valid YAML"):
        load_release_config(path)
    with pytest.raises(ValueError, match=r"date \('01/02/2026'\) must be YYYY-MM-DD"):
        load_release_config(_base(tmp_path), date="01/02/2026")


def test_json_schema_accepts_the_example_and_rejects_unknown_keys() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed")
    if not EXAMPLE.exists():
        pytest.skip("examples/release_adult.yaml not in this checkout")
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    jsonschema.validate(data, RELEASE_CONFIG_SCHEMA)
    data["tables"][0]["colour"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, RELEASE_CONFIG_SCHEMA)


def test_existing_folder_unknown_to_the_ledger_is_refused_and_released(tmp_path: Path) -> None:
    from beamsynth.pipelines.releases.ledger import PrivacyLedger
    from beamsynth.pipelines.releases.release import run_release

    cfg = load_release_config(_base(tmp_path), date="2026-01-01")
    Path(cfg.folder).mkdir()
    with pytest.raises(ReleaseConfigError, match="^folder: .* already exists"):
        run_release(cfg)
    assert [r["state"] for r in PrivacyLedger(cfg.ledger_path).releases()] == ["aborted"]


def test_a_failing_run_aborts_its_reservation_and_leaves_no_temp_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from beamsynth.pipelines.releases import release as release_mod
    from beamsynth.pipelines.releases.ledger import PrivacyLedger

    def boom(*_a, **_k):
        raise RuntimeError("worker lost")

    monkeypatch.setattr(release_mod, "_run_table", boom)
    cfg = load_release_config(_base(tmp_path), date="2026-01-01")
    with pytest.raises(RuntimeError, match="worker lost"):
        release_mod.run_release(cfg)
    (row,) = PrivacyLedger(cfg.ledger_path).releases()
    assert row["state"] == "aborted" and "worker lost" in row["note"]
    assert PrivacyLedger(cfg.ledger_path).summary()[0]["epsilon_spent"] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".rel-")]


def test_reports_without_their_packages_are_refused_up_front(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    cfg = _base(tmp_path)
    cfg["reports"] = {"public": True, "private": False}
    assert _error(cfg).startswith("reports.public: needs ['matplotlib']")


def _hist(tmp_path: Path, **kw) -> dict:
    cfg = _base(tmp_path)
    cfg["tables"] = [dict({"name": "h", "kind": "histogram", "input": cfg["tables"][0]["input"],
                           "schema": "adult", "column": "sex", "tolerance": 0.01, "epsilon": 0.5},
                          **kw)]
    return cfg


def test_histogram_tables_plan_one_cathist_spend(tmp_path: Path) -> None:
    cfg = load_release_config(_hist(tmp_path), date="2026-01-01")
    (spend,) = plan_release(cfg).spends
    assert (spend.step, spend.epsilon, spend.delta) == ("h.cathist.sex", 0.5, 0.0)


@pytest.mark.parametrize(
    ("kw", "path", "message"),
    [({"method": "independent"}, "tables[0].method", "is not used by kind 'histogram'"),
     ({"column": "shoe"}, "tables[0].column", "('shoe') is not a column"),
     ({"tolerance": None}, "tables[0].tolerance", "is required"),
     ({"tolerance": 1.5}, "tables[0].tolerance", "(1.5) must be in (0, 1)"),
     ({"formats": ["csv", "avro"]}, "tables[0].formats", "one-item list"),
     ({"delta": 1e-6}, "tables[0].delta", "must be 0"),
     ({"kind": "prefixes"}, "tables[0].kind", "('prefixes') must be one of")],
)
def test_histogram_table_errors(tmp_path: Path, kw: dict, path: str, message: str) -> None:
    cfg = _hist(tmp_path, **kw)
    if kw.get("tolerance", 0) is None:
        del cfg["tables"][0]["tolerance"]
    text = _error(cfg)
    assert text.startswith(f"{path}: ") and message in text, text


def test_a_column_can_be_released_by_cathist_instead_of_synthesized(tmp_path: Path) -> None:
    cfg = _base(tmp_path)
    cfg["tables"][0]["columns"] = {"age": {}, "sex": {},
                                   "native-country": {"mechanism": "cathist", "epsilon": 0.3,
                                                      "tolerance": 0.001}}
    loaded = load_release_config(cfg, date="2026-01-01")
    synth, hist = loaded.tables
    assert synth.schema.names == ["age", "sex"] and synth.kind == "synthesize"
    assert (hist.name, hist.kind, hist.column, hist.where) == (
        "a.native_country", "histogram", "native-country", "tables[0].columns.native-country")
    steps = {s.step: s.epsilon for s in plan_release(loaded).spends}
    assert steps["a.native_country.cathist.native-country"] == 0.3
    assert sum(steps.values()) == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("opts", "path", "message"),
    [({"mechanism": "cathist"}, "tables[0].columns.native-country.epsilon", "is required"),
     ({"mechanism": "cathist", "epsilon": 0.5, "tolerance": 0.01}, "tables[0].columns.native-country.epsilon",
      "(0.5) overspends budget.epsilon (1): earlier tables already take ε=0.6"),
     ({"mechanism": "cathist", "epsilon": 0.1, "rows": 3}, "tables[0].columns.native-country.rows",
      "unknown key for mechanism 'cathist'"),
     ({"mechanism": "laplace"}, "tables[0].columns.native-country.mechanism",
      "('laplace') must be one of ['synthesize', 'cathist']")],
)
def test_column_mechanism_errors(tmp_path: Path, opts: dict, path: str, message: str) -> None:
    cfg = _base(tmp_path)
    cfg["tables"][0]["columns"] = {"age": {}, "native-country": opts}
    text = _error(cfg)
    assert text.startswith(f"{path}: ") and message in text, text


def test_yaml11_exponent_numbers_are_read_as_numbers(tmp_path: Path) -> None:
    """PyYAML (YAML 1.1) loads ``delta: 1e-5`` as the string "1e-5"; a user means the number."""
    cfg = _base(tmp_path)
    text = yaml.safe_dump(cfg).replace("epsilon: 1.0", "epsilon: 1e0\n  delta: 1e-5", 1)
    assert isinstance(yaml.safe_load(text)["budget"]["delta"], str)  # the YAML 1.1 quirk itself
    path = tmp_path / "release.yaml"
    path.write_text(text, encoding="utf-8")
    loaded = load_release_config(path, date="2026-01-01")
    assert (loaded.epsilon, loaded.delta) == (1.0, 1e-5)
    cfg["budget"]["delta"] = "1e-5x"  # anything else stays an error that echoes the value
    assert _error(cfg) == "budget.delta: must be a number, got '1e-5x'"
