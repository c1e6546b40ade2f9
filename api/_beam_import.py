"""Import Apache Beam once, without its import-time 'apitools not found' warning.

Beam logs that warning on the root logger when its GCP extras are absent, which they need not be
for beamsynth; it was the first line every ``beamsynth`` command printed. The filter is in place
only while Beam is imported, so the logging setup of the user's process is left as it was.
"""

from __future__ import annotations

import logging


class _DropApitoolsWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in record.getMessage()


_FILTER = _DropApitoolsWarning()
logging.getLogger().addFilter(_FILTER)
try:
    import apache_beam  # noqa: F401
finally:
    logging.getLogger().removeFilter(_FILTER)
