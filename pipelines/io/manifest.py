"""Release manifests: what was read, what was spent, what was written — written atomically.

A manifest has two parts:

* ``release``: public facts about the release — method, schema fingerprint, every budget spend
  with its mechanism and noise, the seeded flag, versions, output rows (the output's own size).
* ``operational``: **exact** counts of rows read, used and rejected. They are not DP: keep them
  with the data owner and do not publish them with the release.

:func:`write_json_atomic` (from :mod:`beamsynth.pipelines.io.filesystem`) writes through Beam's
``FileSystems``: a manifest next to ``gs://bucket/out.csv`` lands in the bucket.
"""

from __future__ import annotations

import datetime as _dt
import platform
from typing import Any

from beamsynth.pipelines.io.filesystem import write_json_atomic

__all__ = ["SECURE_NOTE", "SEEDED_NOTE", "build_manifest", "manifest_path", "write_json_atomic", "versions"]

SEEDED_NOTE = "seeded: not for release"
#: Secure mode: every draw is keyed by a per-run secret from OS entropy, held only in the job graph.
SECURE_NOTE = "secure (per-run secret from OS entropy, never written out)"


#: Counts that are the release's own size (public: in ``release``, never in ``operational``).
_PUBLIC_COUNTS = ("rows_out", "rows_out_per_window")


def manifest_path(output: str) -> str:
    """``OUT.manifest.json`` for an output path."""
    return f"{output}.manifest.json"


def versions() -> dict[str, str]:
    """Versions of the packages that shape the output."""
    import apache_beam
    import numpy

    out = {"python": platform.python_version(), "apache-beam": apache_beam.__version__,
           "numpy": numpy.__version__}
    try:
        from importlib.metadata import version

        out["beamsynth"] = version("beamsynth")
    except Exception:  # not installed as a distribution (running from a checkout)
        out["beamsynth"] = "unknown"
    return out


def build_manifest(
    *,
    command: str,
    method: str,
    inputs: list[str],
    outputs: dict[str, str],
    schema_name: str,
    schema_fingerprint: str,
    accountant: dict[str, Any],
    seed: int | None,
    privacy_unit: dict[str, Any],
    counts: dict[str, Any],
    details: dict[str, Any] | None = None,
    privacy_ids: str | None = None,
) -> dict[str, Any]:
    """Assemble a manifest dict (see the module docstring for its two parts).

    ``privacy_ids``: how the encoder read privacy ids (``exact`` or ``rounded``; H71), stated as
    ``release.privacy_unit.ids`` when the unit has an id column: the CLI's commands pass
    ``encode.reader_privacy_ids`` (what their encoders did), the API the schemas' modes;
    ``None`` states nothing (``WindowedSynthesis``' batches)."""
    if privacy_ids is not None and privacy_unit.get("privacy_id") is not None:
        privacy_unit = {**privacy_unit, "ids": privacy_ids}
    return {
        "beamsynth_manifest": 1,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "release": {
            "command": command,
            "method": method,
            "schema": {"name": schema_name, "sha256": schema_fingerprint},
            "privacy_unit": privacy_unit,
            "budget": accountant,
            "randomness": SEEDED_NOTE if seed is not None else SECURE_NOTE,
            "seed": seed,
            "rows_out": counts.get("rows_out"),
            **({} if counts.get("rows_out_per_window") is None
               else {"rows_out_per_window": counts["rows_out_per_window"]}),
            "outputs": outputs,
            "details": details or {},
            "versions": versions(),
        },
        "operational": {
            "note": "exact counts, NOT differentially private: do not publish",
            "inputs": inputs,
            **{k: v for k, v in counts.items() if k not in _PUBLIC_COUNTS},
        },
    }
