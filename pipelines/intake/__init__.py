"""Intake: the rules of trust every way in passes through before anything is assembled.

Who a session belongs to (``ownership``), whose verdict counts (``verdicts`` attaches harness
reports later), and where whatever a rule set aside is recorded (``quarantine``). This module
only hands those names on.
"""

from pipelines.intake.ownership import OWN_EVALUATOR, apply_ownership, has_payload_field, verdict_provenance_sql
from pipelines.intake.quarantine import DETAIL_CHARS, Quarantined, quarantine_rows, record_quarantine
from pipelines.intake.verdicts import Attached, attach_verdicts, run_id

__all__ = [
    "DETAIL_CHARS",
    "OWN_EVALUATOR",
    "Attached",
    "Quarantined",
    "apply_ownership",
    "attach_verdicts",
    "has_payload_field",
    "quarantine_rows",
    "record_quarantine",
    "run_id",
    "verdict_provenance_sql",
]
