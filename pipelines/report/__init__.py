"""``trajlake report``: a static HTML report of the lakehouse, or of one export, that a person opens in a browser.

``index.html`` holds the figures (pass rates by task family, quality and cost distributions as
inline SVG, outcomes) and the flagged sessions with their evidence; ``sessions/<id>.html`` holds
one session each (its steps, output, diffs, model calls, evaluation, flags, scores), for the
flagged sessions first and then the most recent, up to ``TRAJLAKE_REPORT_MAX_SESSIONS``. The
files are plain HTML with no script and no remote resource: they can be opened from disk,
copied or served by any static web server.
"""

from pipelines.errors import ReportError
from pipelines.report.write import ReportStats, page_name, write_report

__all__ = ["ReportError", "ReportStats", "page_name", "write_report"]
