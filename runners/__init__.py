"""Runner presets and launch helpers (``beamsynth.runners.presets``); see ``docs/runners.md``."""

from beamsynth.runners.presets import (
    PRESETS,
    Preset,
    PresetError,
    is_dask,
    options_for,
    preset_names,
)

__all__ = ["PRESETS", "Preset", "PresetError", "is_dask", "options_for", "preset_names"]
