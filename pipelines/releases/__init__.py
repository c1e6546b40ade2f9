"""Releases: declarative release configs, the privacy ledger across releases, reports.

* :mod:`~beamsynth.pipelines.releases.config`: the release config format and its validation
  before any data is read (``load_release_config``);
* :mod:`~beamsynth.pipelines.releases.release`: plan (every spend before data), reserve in the
  ledger, run the tables into a hidden temp folder, publish atomically (``plan_release``,
  ``run_release``);
* :mod:`~beamsynth.pipelines.releases.ledger`: the SQLite privacy ledger (``PrivacyLedger``,
  budget policies per data source);
* :mod:`~beamsynth.pipelines.releases.report`: public and private HTML reports;
  :mod:`~beamsynth.pipelines.releases.quality`: fidelity and ML-efficacy metrics.

Uses :mod:`beamsynth.pipelines.methods` and :mod:`beamsynth.pipelines.io`; never imports ``cli``.
"""
