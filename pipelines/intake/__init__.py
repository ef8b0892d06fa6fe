"""Intake: the rules of trust every way in passes through before anything is assembled.

The gate itself (``admission``: at the door and at assembly, every rule applied in one place); who a
session belongs to (``ownership``: by arrival), whose verdict counts (``precedence``; ``verdicts``
attaches harness reports later), and where whatever a rule set aside is recorded (``quarantine``). This module
only hands those names on.
"""

from pipelines.intake.admission import Admitted, Door, admit, admit_session, admit_verdict, door_key
from pipelines.intake.ownership import (
    ARRIVAL_SQL,
    IDENTITY_SQL,
    VERDICTS_DOOR,
    apply_ownership,
    has_payload_field,
    verdict_provenance_sql,
)
from pipelines.intake.precedence import OWN_EVALUATOR, PRECEDENCE, outranks, rank, rank_sql
from pipelines.intake.quarantine import DETAIL_CHARS, Quarantined, quarantine_rows, record_quarantine
from pipelines.intake.verdicts import Attached, attach_verdicts, run_id

__all__ = [
    "Admitted",
    "Door",
    "admit",
    "admit_session",
    "admit_verdict",
    "door_key",
    "ARRIVAL_SQL",
    "DETAIL_CHARS",
    "IDENTITY_SQL",
    "OWN_EVALUATOR",
    "PRECEDENCE",
    "VERDICTS_DOOR",
    "Attached",
    "Quarantined",
    "apply_ownership",
    "attach_verdicts",
    "has_payload_field",
    "outranks",
    "quarantine_rows",
    "rank",
    "rank_sql",
    "record_quarantine",
    "run_id",
    "verdict_provenance_sql",
]
