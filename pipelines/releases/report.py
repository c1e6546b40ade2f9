"""HTML reports of a release: a private quality report and a public report of the DP outputs.

* :func:`private_report_html` compares a real table with a synthetic one over the schema's
  declared cells: per-column distributions, pairwise association heatmaps (Cramér's V), the
  learned network (when the model's ``describe()`` exposes ``edges``), TVD per marginal and a
  train-on-synthetic/test-on-real check (metrics from :mod:`beamsynth.pipelines.releases.quality`). It
  **contains private statistics** of the real data and says so at the top: for the data owner only.
* :func:`public_report_html` is built **only from released DP outputs** — ``release.json`` (every
  spend with its mechanism and noise scale, the released row counts) and the synthetic tables — and
  adds error bars from the noise law (discrete Laplace: :func:`discrete_laplace_interval`).

Plots are matplotlib PNGs embedded as base64 ``data:`` URIs, so a report is one self-contained
file. Rendering is evaluation, not release: nothing here spends budget.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from beamsynth.pipelines.io.filesystem import exists, is_local, join, read_text, write_text_atomic
from beamsynth.pipelines.releases.ledger import lifetime_text
from beamsynth.pipelines.releases.quality import (
    as_codes,
    encode_frame,
    marginal_table,
    ml_efficacy,
    quality_report,
)
from beamsynth.schemas.schema import Column, Schema, avro_field_name
from beamsynth.transforms.measure import count_marginals
from beamsynth.transforms.noise import RandomSource

__all__ = [
    "PRIVATE_BANNER",
    "build_report",
    "cell_labels",
    "cramers_v_matrix",
    "discrete_laplace_interval",
    "private_report_html",
    "public_report_html",
    "read_table",
    "real_codes",
    "write_release_reports",
]

PRIVATE_BANNER = ("CONTAINS PRIVATE STATISTICS of the real data (not differentially private): "
                  "for the data owner only — do not publish")
_MAX_LABELLED_CELLS = 40
_TSTR_ROWS = 5_000
_CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px}
.banner{background:#b00020;color:#fff;padding:1em;font-weight:bold;font-size:1.1em}
.public{background:#0b6e4f;color:#fff;padding:1em;font-weight:bold}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #999;padding:.3em .6em;
text-align:left}img{max-width:100%;display:block;margin:.5em 0}.grid{display:flex;flex-wrap:wrap}
.grid figure{width:48%;margin:.5%}"""


# -- helpers ---------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> str:
    """A matplotlib figure as an ``<img>`` tag with a base64 PNG data URI (figure closed)."""
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=64, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _e(value: Any) -> str:
    return html.escape(str(value))


def _table_html(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _page(title: str, banner: str, banner_class: str, sections: Sequence[str]) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}"
            f"</title><style>{_CSS}</style></head><body><div class=\"{banner_class}\" "
            f"id=\"banner\">{_e(banner)}</div><h1>{_e(title)}</h1>" + "\n".join(sections)
            + "</body></html>\n")


def cell_labels(column: Column) -> list[str]:
    """Human labels of a column's declared cells (values, bin ranges, ``(null)``)."""
    dom = column.domain
    values = getattr(dom, "values", None)
    edges = getattr(dom, "edges", None)
    if isinstance(values, list):
        labels = [str(v) for v in values] + ([] if getattr(dom, "other", None) is None else [str(dom.other)])
    elif edges is not None:
        e = np.asarray(edges)
        labels = [f"{e[i]:g}–{e[i + 1]:g}" for i in range(e.size - 1)]
    elif dom.size <= _MAX_LABELLED_CELLS:
        labels = [str(dom.decode(i)) for i in range(dom.size)]
    else:
        labels = [str(i) for i in range(dom.size)]
    if column.null_index is not None:
        labels.append("(null)")
    return labels


def read_table(path: str, *, max_rows: int | None = None) -> pd.DataFrame:
    """Read a csv/jsonl/avro/parquet table as strings (CSV: no NA guessing)."""
    from beamsynth.pipelines.io.records import detect_format

    fmt = detect_format(path)
    if not is_local(path):  # any Beam file system: a (decompressed) stream
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path) as fh:
            return _read_frame(fmt, fh if fmt in ("csv", "jsonl") else io.BytesIO(fh.read()),
                               max_rows)
    return _read_frame(fmt, path, max_rows)


def _read_frame(fmt: str, source: Any, max_rows: int | None) -> pd.DataFrame:
    if fmt == "csv":
        return pd.read_csv(source, dtype=str, keep_default_na=False, nrows=max_rows)
    if fmt == "jsonl":
        return pd.read_json(source, lines=True, dtype=False, nrows=max_rows)
    if fmt == "parquet":
        frame = pd.read_parquet(source)
    else:
        import fastavro

        if isinstance(source, str):
            with open(source, "rb") as fh:
                frame = pd.DataFrame.from_records(list(fastavro.reader(fh)))
        else:
            frame = pd.DataFrame.from_records(list(fastavro.reader(source)))
    return frame if max_rows is None else frame.iloc[:max_rows]


def _aligned(schema: Schema, frame: pd.DataFrame) -> pd.DataFrame:
    """Accept Avro/Beam-safe column names (``education_num``) for declared ``education-num``."""
    renames = {avro_field_name(n): n for n in schema.names
               if n not in frame.columns and avro_field_name(n) in frame.columns}
    return frame.rename(columns=renames) if renames else frame


def discrete_laplace_interval(scale: float, *, level: float = 0.95) -> int:
    """Smallest integer t with P(|Z| ≤ t) ≥ ``level`` for discrete Laplace noise of ``scale``.

    With q = exp(−1/b), P(|Z| > t) = 2·q^(t+1)/(1+q), so t = ⌈ln(α(1+q)/2)/ln q⌉ − 1, α = 1 − level.
    """
    if not (isinstance(scale, (int, float)) and scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale ({scale!r}) must be a finite number > 0")
    if not (0 < level < 1):
        raise ValueError(f"level ({level!r}) must be in (0, 1)")
    q = math.exp(-1.0 / scale)
    t = math.ceil(math.log((1 - level) * (1 + q) / 2) / math.log(q)) - 1
    t = max(t, 0)
    while 2 * q ** (t + 1) / (1 + q) > 1 - level:  # guard against rounding
        t += 1
    return t


def cramers_v_matrix(codes: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Cramér's V of every column pair of a code matrix (bias-free form, 0 on the diagonal)."""
    d = len(shape)
    out = np.zeros((d, d))
    n = codes.shape[0]
    if n == 0:
        return out
    pairs = list(itertools.combinations(range(d), 2))
    tables = count_marginals(codes, pairs, shape)
    for (a, b), t in zip(pairs, tables):
        m = t.reshape(int(shape[a]), int(shape[b])).astype(np.float64)
        m = m[m.sum(axis=1) > 0][:, m.sum(axis=0) > 0]
        r, c = m.shape
        if r < 2 or c < 2:
            continue
        expected = np.outer(m.sum(axis=1), m.sum(axis=0)) / n
        chi2 = float(((m - expected) ** 2 / expected).sum())
        out[a, b] = out[b, a] = math.sqrt(chi2 / n / (min(r, c) - 1))
    return out


# -- private report --------------------------------------------------------------------------------
def _distribution_plots(schema: Schema, real: np.ndarray, synth: np.ndarray) -> str:
    plt = _plt()
    figs = []
    shape = schema.shape
    for j, col in enumerate(schema.columns):
        p = marginal_table(real, shape, (j,))
        q = marginal_table(synth, shape, (j,))
        fig, ax = plt.subplots(figsize=(6, 3))
        x = np.arange(p.size)
        if p.size <= _MAX_LABELLED_CELLS:
            ax.bar(x - 0.2, p, 0.4, label="real")
            ax.bar(x + 0.2, q, 0.4, label="synthetic")
            ax.set_xticks(x, cell_labels(col), rotation=60, ha="right", fontsize=7)
        else:
            ax.step(x, p, where="mid", label="real")
            ax.step(x, q, where="mid", label="synthetic")
        ax.set_title(col.name)
        ax.set_ylabel("share")
        ax.legend(fontsize=7)
        figs.append(f"<figure>{_png(fig)}</figure>")
    return "<div class=\"grid\">" + "".join(figs) + "</div>"


def _heatmaps(schema: Schema, real: np.ndarray, synth: np.ndarray) -> str:
    plt = _plt()
    names = schema.names
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, codes, title in ((axes[0], real, "real"), (axes[1], synth, "synthetic")):
        v = cramers_v_matrix(codes, schema.shape)
        im = ax.imshow(v, vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_title(f"Cramér's V, {title}")
    fig.colorbar(im, ax=axes, shrink=0.8)
    return _png(fig)


def _network(description: Mapping[str, Any] | None, names: Sequence[str]) -> str | None:
    """Draw the learned network: ``edges`` ([parent, child] pairs) or ``structure``
    ([child, [parents...]] entries, as PrivBayes describes itself), if the model has either."""
    description = description or {}
    edges = [tuple(e) for e in description.get("edges") or []]
    for entry in description.get("structure") or []:
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[1], (list, tuple)):
            edges += [(parent, entry[0]) for parent in entry[1]]
    if not edges:
        return None
    plt = _plt()
    nodes = list(names)
    for a, b in edges:
        for v in (str(a), str(b)):
            if v not in nodes:
                nodes.append(v)
    angle = np.linspace(0, 2 * np.pi, len(nodes), endpoint=False)
    pos = {v: (math.cos(t), math.sin(t)) for v, t in zip(nodes, angle)}
    fig, ax = plt.subplots(figsize=(7, 7))
    for a, b in edges:
        (x0, y0), (x1, y1) = pos[str(a)], pos[str(b)]
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "->", "color": "#555", "shrinkA": 12, "shrinkB": 12})
    for v, (x, y) in pos.items():
        ax.text(x, y, v, ha="center", va="center", fontsize=8,
                bbox={"boxstyle": "round", "fc": "#e8f0fe", "ec": "#3367d6"})
    ax.set_xlim(-1.3, 1.3)
    ax.set_ylim(-1.3, 1.3)
    ax.axis("off")
    ax.set_title("learned network (parent → child)")
    return _png(fig)


def _tvd_section(schema: Schema, real: np.ndarray, synth: np.ndarray, seed: int) -> str:
    empty = [name for name, codes in (("real", real), ("synthetic", synth)) if codes.shape[0] == 0]
    if empty:  # an empty side's tables are uniform by convention: its TVDs would mean nothing
        return (f"<p>TVD not computed: no {' and no '.join(empty)} rows to compare (an empty "
                "table is drawn as uniform in the plots above).</p>")
    plt = _plt()
    rep = quality_report(schema, real, synth, n_three_way=50, seed=seed)
    names = schema.names
    d = len(names)
    one = [rep.per_marginal[(j,)] for j in range(d)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    axes[0].bar(range(d), one)
    axes[0].set_xticks(range(d), names, rotation=90, fontsize=7)
    axes[0].set_title("TVD of each 1-way marginal")
    m = np.full((d, d), np.nan)
    for (a, b), v in ((k, v) for k, v in rep.per_marginal.items() if len(k) == 2):
        m[a, b] = m[b, a] = v
    im = axes[1].imshow(m, vmin=0, vmax=max(0.01, float(np.nanmax(m)) if d > 1 else 1), cmap="magma_r")
    axes[1].set_xticks(range(d), names, rotation=90, fontsize=7)
    axes[1].set_yticks(range(d), names, fontsize=7)
    axes[1].set_title("TVD of each 2-way marginal")
    fig.colorbar(im, ax=axes[1], shrink=0.8)
    summary = _table_html(
        [["1-way", f"{rep.tvd1:.4f}", d], ["2-way", f"{rep.tvd2:.4f}", d * (d - 1) // 2],
         ["3-way (random)", f"{rep.tvd3:.4f}", sum(1 for k in rep.per_marginal if len(k) == 3)]],
        ["marginals", "mean TVD", "count"])
    return summary + _png(fig)


def _tstr_section(schema: Schema, real: np.ndarray, synth: np.ndarray, target: str | None,
                  seed: int) -> str:
    if target is None:
        binary = [c.name for c in schema.columns if c.domain.size == 2]
        if not binary:
            return "<p>No binary column to predict: train-on-synthetic/test-on-real skipped.</p>"
        target = binary[-1]
    try:
        gen = RandomSource(seed=seed).child("report", "split").numpy_generator()
        order = gen.permutation(real.shape[0])
        cut = real.shape[0] // 2
        train_real = real[order[:cut][:_TSTR_ROWS]]
        test_real = real[order[cut:][:_TSTR_ROWS]]
        synth = synth[gen.permutation(synth.shape[0])[:_TSTR_ROWS]]
        from threadpoolctl import threadpool_limits  # scikit-learn dependency

        with threadpool_limits(1):  # OpenMP spin-waits badly on a busy machine
            tstr = ml_efficacy(schema, synth, test_real, target=target, seed=seed)
            trtr = ml_efficacy(schema, train_real, test_real, target=target, seed=seed)
    except ImportError as exc:
        return f"<p>train-on-synthetic/test-on-real skipped: {_e(exc)}</p>"
    except ValueError as exc:
        return f"<p>train-on-synthetic/test-on-real skipped for target {_e(target)}: {_e(exc)}</p>"
    return (f"<p>Target <b>{_e(target)}</b>; test set: up to {_TSTR_ROWS} rows of a random half of "
            f"the real rows; training sets: up to {_TSTR_ROWS} rows.</p>"
            + _table_html([["synthetic (TSTR)", f"{tstr['accuracy']:.4f}", f"{tstr['auc']:.4f}"],
                           ["real half (baseline)", f"{trtr['accuracy']:.4f}", f"{trtr['auc']:.4f}"]],
                          ["trained on", "accuracy", "ROC AUC"]))


def private_report_html(
    schema: Schema,
    real: pd.DataFrame | np.ndarray,
    synthetic: pd.DataFrame,
    *,
    title: str = "beamsynth quality report",
    target: str | None = None,
    model_description: Mapping[str, Any] | None = None,
    seed: int = 0,
    real_dropped: int = 0,
) -> str:
    """The quality report comparing ``real`` with ``synthetic`` (contains private statistics).

    ``real``: a DataFrame of values, or the code matrix of the records a pipeline used
    (:func:`real_codes`; ``real_dropped`` then counts the records its reader rejected)."""
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a Schema, got {type(schema).__name__}")
    if target is not None and target not in schema.names:
        raise ValueError(f"target ({target!r}) is not a column of the schema ({schema.names})")
    if isinstance(real, pd.DataFrame):
        real_codes, real_dropped = encode_frame(schema, _aligned(schema, real))
    else:
        real_codes = as_codes(schema, real)
    synth_codes, synth_dropped = encode_frame(schema, _aligned(schema, synthetic))
    sections = [
        f"<p>Real rows compared: {real_codes.shape[0]} ({real_dropped} outside the declared "
        f"domains dropped); synthetic rows: {synth_codes.shape[0]} ({synth_dropped} dropped). "
        "Distances are computed over the schema's declared cells.</p>",
        "<h2>Per-column distributions</h2>", _distribution_plots(schema, real_codes, synth_codes),
        "<h2>Pairwise association</h2>", _heatmaps(schema, real_codes, synth_codes),
    ]
    net = _network(model_description, schema.names)
    sections += ["<h2>Learned network</h2>",
                 net or "<p>The model exposes no network (no <code>edges</code> or "
                        "<code>structure</code> in its description).</p>"]
    if model_description:
        sections.append(f"<pre>{_e(json.dumps(model_description, indent=1, default=str)[:4000])}</pre>")
    sections += ["<h2>TVD per marginal</h2>", _tvd_section(schema, real_codes, synth_codes, seed),
                 "<h2>Train on synthetic, test on real</h2>",
                 _tstr_section(schema, real_codes, synth_codes, target, seed)]
    return _page(title, PRIVATE_BANNER, "banner", sections)


# -- public report ---------------------------------------------------------------------------------
def _spend_rows(spends: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    rows = []
    for s in spends:
        det = s.get("details") or {}
        scale = _declared_scale(det)
        interval = ""
        if isinstance(scale, (int, float)) and scale > 0 and "laplace" in str(s.get("mechanism", "")).lower():
            interval = f"±{discrete_laplace_interval(float(scale))}"
        rows.append([s.get("step"), s.get("mechanism"), f"{s.get('epsilon', 0):g}",
                     f"{s.get('delta', 0):g}", "" if scale is None else f"{scale:g}", interval])
    return rows


def _guarantee_rows(details: Mapping[str, Any] | None) -> list[list[Any]]:
    """Rows of a method's ``release_guarantee.side_by_side`` (e.g. plausible deniability: per
    released record next to the dataset-level charge), empty when the method states none."""
    method = (details or {}).get("method")
    side = ((method or {}).get("release_guarantee") or {}).get("side_by_side") if isinstance(method, Mapping) else None
    return [[r.get("level"), f"{r.get('epsilon', 0):.6g}", f"{r.get('delta', 0):.3g}", r.get("neighbours", "")]
            for r in side or [] if isinstance(r, Mapping)]


def _declared_scale(details: Mapping[str, Any]) -> float | None:
    """The noise scale a spend declares (``scale``, ``scale_per_table``, or any ``*scale*`` key)."""
    keys = ["scale", "scale_per_table"] + sorted(
        k for k in details if "scale" in k and "penalty" not in k and not k.endswith("_note"))
    for k in keys:
        v = details.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v)
    return None


def _unit_text(unit: Any) -> str:
    if not isinstance(unit, Mapping):
        return str(unit)
    pid = unit.get("privacy_id")
    who = "one record" if pid is None else f"one {pid} (at most {unit.get('max_contributions')} records)"
    return f"{who}; neighbouring datasets: {unit.get('neighbouring', 'add/remove one unit')}"


def _marginal_scale(spends: Sequence[Mapping[str, Any]]) -> float | None:
    """Per-cell noise scale of released 1-way marginals, when a spend declares it."""
    for s in spends:
        det = s.get("details") or {}
        if "1-way" in str(s.get("mechanism", "")) and isinstance(det.get("scale_per_table"), (int, float)):
            return float(det["scale_per_table"])
    return None


def _public_plots(schema: Schema, synthetic: pd.DataFrame, rows_out: int | None,
                  scale: float | None) -> str:
    plt = _plt()
    codes, _ = encode_frame(schema, _aligned(schema, synthetic))
    half = None if scale is None or not rows_out else discrete_laplace_interval(scale) / rows_out
    figs = []
    for j, col in enumerate(schema.columns):
        q = marginal_table(codes, schema.shape, (j,))
        fig, ax = plt.subplots(figsize=(6, 3))
        x = np.arange(q.size)
        if q.size <= _MAX_LABELLED_CELLS:
            ax.bar(x, q, 0.6, yerr=None if half is None else np.full(q.size, half), capsize=2,
                   color="#0b6e4f")
            ax.set_xticks(x, cell_labels(col), rotation=60, ha="right", fontsize=7)
        else:
            ax.step(x, q, where="mid", color="#0b6e4f")
            if half is not None:
                ax.fill_between(x, np.clip(q - half, 0, None), q + half, step="mid", alpha=0.3)
        ax.set_title(col.name)
        ax.set_ylabel("share of synthetic rows")
        figs.append(f"<figure>{_png(fig)}</figure>")
    note = ("<p>Error bars: 95% interval of the discrete Laplace noise on each measured count, "
            "divided by the released row count (noise only; sampling adds more).</p>"
            if half is not None else
            "<p>This mechanism declares no per-cell noise scale for 1-way tables; no error bars.</p>")
    return note + "<div class=\"grid\">" + "".join(figs) + "</div>"


def _public_histogram(frame: pd.DataFrame, spends: Sequence[Mapping[str, Any]],
                      top: int = _MAX_LABELLED_CELLS) -> str:
    """Bar chart of a released (category, noisy count) table with the noise law's 95% interval."""
    plt = _plt()
    if frame.shape[1] < 2 or frame.empty:
        return "<p>No category passed the release threshold.</p>"
    labels = frame.iloc[:top, 0].astype(str).tolist()
    counts = pd.to_numeric(frame.iloc[:top, 1]).to_numpy(dtype=float)
    scale = next((_declared_scale(s.get("details") or {}) for s in spends
                  if _declared_scale(s.get("details") or {}) is not None), None)
    half = None if scale is None else discrete_laplace_interval(scale)
    fig, ax = plt.subplots(figsize=(10, 3.5))
    x = np.arange(len(labels))
    ax.bar(x, counts, 0.6, yerr=None if half is None else np.full(len(labels), half), capsize=2,
           color="#0b6e4f")
    ax.set_xticks(x, labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("noisy count")
    note = (f"<p>{len(frame)} categories released (largest {len(labels)} shown); error bars: 95% "
            f"interval ±{half} of the discrete Laplace noise (scale {scale:g}).</p>"
            if half is not None else f"<p>{len(frame)} categories released.</p>")
    return note + _png(fig)


def public_report_html(release: Mapping[str, Any], synthetic: Mapping[str, pd.DataFrame],
                       schemas: Mapping[str, Schema],
                       models: Mapping[str, Mapping[str, Any] | None] | None = None,
                       histograms: Mapping[str, pd.DataFrame] | None = None) -> str:
    """The public report of a release, from released DP outputs only: ``release.json``, the
    synthetic tables and the fitted models' descriptions (post-processing of DP measurements)."""
    sections = [
        f"<p>{_e(release.get('description', ''))}</p>",
        _table_html([["release", release.get("name")], ["release id", release.get("release_id")],
                     ["created", release.get("created")],
                     ["budget of this release", f"ε={release['budget']['epsilon']:g}, "
                                                f"δ={release['budget']['delta']:g}"],
                     ["spent", f"ε={release['spent']['epsilon']:g}, δ={release['spent']['delta']:g}"],
                     ["ledger policies", "; ".join(f"{k}: {v}" for k, v in
                                                   release.get("ledger", {}).get("policies", {}).items())],
                     ["lifetime total (incl. this release)",
                      lifetime_text(release.get("ledger", {}).get("sources", {}))]],
                    ["", ""]),
    ]
    for name, tab in release.get("tables", {}).items():
        spends = tab["budget"]["spends"]
        rows_out = tab.get("rows_out")
        count_spend = next((s for s in spends if s.get("step") == "row_count"), None)
        count_note = ""
        if count_spend and rows_out is not None:
            t = discrete_laplace_interval(float(count_spend["details"]["scale"]))
            count_note = (f" The row count is a DP estimate: the true count lies within ±{t} of the "
                          f"noisy count with 95% probability.")
        sections += [
            f"<h2>Table {_e(name)}</h2>",
            f"<p>Method <b>{_e(tab.get('method'))}</b>, data source {_e(tab.get('source'))}, privacy "
            f"unit {_e(_unit_text(tab.get('privacy_unit')))}; "
            + (f"{rows_out} categories released (rows of category, noisy count); "
               if tab.get("command") == "histogram" else f"{rows_out} synthetic rows released; ") +
            f"randomness: "
            f"{_e(tab.get('randomness'))}.{count_note}</p>",
            "<h3>Privacy spends (basic sequential composition)</h3>",
            _table_html(_spend_rows(spends),
                        ["step", "mechanism", "ε", "δ", "noise scale b", "95% noise interval"]),
        ]
        guarantee = _guarantee_rows(tab.get("details"))
        if guarantee:
            sections += ["<h3>Guarantee per released record and for the whole release</h3>",
                         _table_html(guarantee, ["level", "ε", "δ", "neighbouring datasets"])]
        net = _network((models or {}).get(name), schemas[name].names if name in schemas else [])
        if net:
            sections += ["<h3>Released model structure</h3>", net]
        if name in (histograms or {}):
            sections += ["<h3>Released DP histogram</h3>",
                         _public_histogram(histograms[name], spends)]
        if name in synthetic and name in schemas:
            sections += ["<h3>Released synthetic distributions</h3>",
                         _public_plots(schemas[name], synthetic[name], rows_out, _marginal_scale(spends))]
    return _page(f"Release {release.get('name')}: public report",
                 "Public report: built only from differentially private outputs", "public", sections)


# -- files -----------------------------------------------------------------------------------------
def write_release_reports(cfg: Any, folder: str, release: Mapping[str, Any],
                          manifests: Mapping[str, Mapping[str, Any]],
                          progress: Any = None) -> dict[str, str]:
    """Write ``public/report.html`` and ``private/report.html`` into a release (temp) folder.

    ``progress``: a one-line callback (the CLI's progress printer) told before each report part,
    since plots and the ML-efficacy models take tens of seconds on large tables."""
    say = progress or (lambda _line: None)
    written = {}
    synth = {}
    schemas = {}
    histograms = {}
    synth_tables = [t for t in cfg.tables if getattr(t, "kind", "synthesize") == "synthesize"]
    for t in cfg.tables:
        out = join(folder, "public", f"{t.name}.{t.formats[0]}")
        if t not in synth_tables:
            histograms[t.name] = read_table(out)
            continue
        synth[t.name] = read_table(out, max_rows=cfg.max_plot_rows)
        schemas[t.name] = t.schema.select(manifests[t.name]["release"]["details"]["columns"])
    models = {t.name: _read_model(join(folder, "public", f"{t.name}.model.json"))
              for t in synth_tables}
    if cfg.public_report:
        say(f"public report: plots of {len(cfg.tables)} table(s) from the released files")
        path = join(folder, "public", "report.html")
        _write_text(path, public_report_html(release, synth, schemas, models, histograms))
        written["public"] = path
    if cfg.private_report and synth_tables:
        parts = []
        for t in synth_tables:
            title = f"{cfg.name} / {t.name}: quality report"
            say(f"private report of table {t.name}: fidelity and ML efficacy against the real rows")
            try:  # reads the private rows: nothing in them may stop the release (rules 7 and 8)
                real, rejected = real_codes(schemas[t.name], _expand(t.inputs), max_rows=cfg.max_plot_rows)
                target = cfg.target if cfg.target in schemas[t.name].names else None
                page = private_report_html(schemas[t.name], real, synth[t.name], title=title,
                                           target=target, model_description=models[t.name],
                                           real_dropped=rejected)
            except Exception as exc:  # any failure here depends on the private rows
                page = _page(title, PRIVATE_BANNER, "banner",
                             [f"<p>The quality report could not be computed: {_e(type(exc).__name__)}: "
                              f"{_e(exc)}</p>"])
            parts.append((t.name, page))
        path = join(folder, "private", "report.html")
        body = parts[0][1] if len(parts) == 1 else _join_pages(parts)
        _write_text(path, body)
        written["private"] = path
    return written


def real_codes(schema: Schema, paths: Sequence[str], *, max_rows: int) -> tuple[np.ndarray, int]:
    """``(codes, rejected)`` of up to ``max_rows`` records of ``paths`` that the pipeline uses,
    read by its own readers and encoder (every record judged alone: a malformed line or a value
    outside the declared domain is counted in ``rejected``, never an error)."""
    from beamsynth.pipelines.io.encode import encode_block
    from beamsynth.pipelines.io.read import iter_raw_blocks
    from beamsynth.pipelines.io.records import RawBlock

    parts, rejected, kept = [], 0, 0
    for path in paths:
        for block in iter_raw_blocks(path):
            if kept >= max_rows:
                return np.concatenate(parts), rejected
            if not isinstance(block, RawBlock):
                rejected += 1
                continue
            batch, bad = encode_block(schema, block)
            rejected += len(bad)
            parts.append(np.asarray(batch.codes, dtype=np.int64)[:max_rows - kept])
            kept += parts[-1].shape[0]
    return (np.concatenate(parts) if parts else np.zeros((0, len(schema.shape)), np.int64)), rejected


def _expand(patterns: Sequence[str]) -> list[str]:
    import glob

    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    out: list[str] = []
    for pat in patterns:
        if is_local(pat):
            out += sorted(glob.glob(pat))
            continue
        try:
            out += sorted(m.path for m in FileSystems.match([pat])[0].metadata_list)
        except BeamIOError:
            pass
    return out


def _join_pages(parts: Sequence[tuple[str, str]]) -> str:
    bodies = [p.split("<body>", 1)[1].rsplit("</body>", 1)[0] for _, p in parts]
    head = parts[0][1].split("<body>", 1)[0]
    return head + "<body>" + "<hr>".join(bodies) + "</body></html>\n"


def _read_model(path: str) -> dict[str, Any] | None:
    try:
        if not exists(path):
            return None
        line = read_text(path).split("\n", 1)[0]
        return json.loads(line) if line.strip() else None
    except (OSError, ValueError):
        return None


def _write_text(path: str, text: str) -> None:
    write_text_atomic(path, text)  # Beam FileSystems: local, gs://, s3://, hdfs://


def build_report(*, real: str, synthetic: str, schema: Schema, output: str,
                 target: str | None = None, max_rows: int = 200_000, seed: int = 0) -> str:
    """``beamsynth report``: the private quality report for any real/synthetic pair of files."""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows ({max_rows!r}) must be an int >= 1")
    for what, path in (("real", real), ("synthetic", synthetic)):
        if not _expand([path]):
            raise FileNotFoundError(f"{what} table {path!r}: no such file")
    real_rows, rejected = real_codes(schema, _expand([real]), max_rows=max_rows)  # the pipeline's reading rules
    synth_df = read_table(synthetic, max_rows=max_rows)
    text = private_report_html(schema, real_rows, synth_df, target=target, seed=seed, real_dropped=rejected,
                               title=f"Quality report: {os.path.basename(synthetic)} vs "
                                     f"{os.path.basename(real)}")
    _write_text(output, text)
    return output
