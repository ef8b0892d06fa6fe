"""The one verdict precedence: whose verdict counts when a session has several.

From highest to lowest: the fleet's own evaluator (the owner's evaluation, provenance
``fleet_evaluator`` or none), a harness report matched to the session by its exact instance id
(``harness_report``, ``harbor_verifier``; attached by ``trajlake import --verdicts`` or joined into
an import), anything self-reported (``self_reported``, a reward the agent's own file claims). A
provenance this list does not know ranks below all of them. Only provenances in
``TRAJLAKE_TRUSTED_VERDICTS`` count at all; among those that do, the highest rank present in the
session counts and every verdict of a lower rank is kept in ``events`` but not counted, with a
quarantine row (``reason = 'lower_verdict'``): a lower provenance never replaces a higher one,
whatever order or ``seq`` they claim.

:func:`rank` is the rule; :func:`rank_sql` is the same rule for assembly's SQL, generated from the
same table so the two cannot disagree.
"""

from __future__ import annotations

from producers.importers.verdicts import FLEET, HARBOR, HARNESS, SELF_REPORTED

#: Provenances from highest to lowest; the same rank for provenances on one line.
PRECEDENCE: tuple[tuple[str, ...], ...] = ((FLEET,), (HARNESS, HARBOR), (SELF_REPORTED,))

#: The provenance an owner's evaluation without one has (the producer's own evaluator).
OWN_EVALUATOR = FLEET


def rank(provenance: str | None) -> int:
    """The verdict's rank: higher counts over lower; an unknown provenance ranks 0."""
    provenance = provenance or OWN_EVALUATOR
    for i, names in enumerate(PRECEDENCE):
        if provenance in names:
            return len(PRECEDENCE) - i
    return 0


def outranks(new: str | None, held: str | None) -> bool:
    """Whether a verdict of provenance ``new`` may replace one of ``held`` (an equal rank may: a re-evaluation)."""
    return rank(new) >= rank(held)


def rank_sql(provenance: str) -> str:
    """SQL of :func:`rank` over the expression ``provenance`` (NULL is the owner's own evaluator)."""
    cases = " ".join(
        f"WHEN coalesce({provenance}, '{OWN_EVALUATOR}') = '{name}' THEN {rank(name)}"
        for names in PRECEDENCE
        for name in names
    )
    return f"(CASE {cases} ELSE 0 END)"
