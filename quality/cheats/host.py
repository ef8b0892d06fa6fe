"""Cheats and blind spots the sandbox host reported: a session it ended because it could no longer watch it.

The egress gateway records every network attempt of a sandbox; if it ever dies, it fails closed
(network refused) and the host ends the session with ``exit_reason`` ``egress_monitor_failed``.
What the sandbox did meanwhile is unknown: the session is flagged ``egress_monitor_failed``
(security: never exported), whoever caused the failure.
"""

from __future__ import annotations

from quality.cheats.evidence import Hit, SessionContext

#: Exit reasons of a session its host could not watch to the end, and the flag each raises.
HOST_EXIT_FLAGS = {"egress_monitor_failed": "egress_monitor_failed"}


def from_host(ctx: dict[str, SessionContext]) -> list[Hit]:
    """A flag per session the host ended because its monitoring failed."""
    hits = []
    for sid, session in ctx.items():
        flag = HOST_EXIT_FLAGS.get(session.exit_reason)
        if flag is not None:
            reason = "the egress gateway stopped recording; the host refused all network and ended the session"
            hits.append(Hit(sid, flag, session.eval_event_id, reason=reason))
    return hits
