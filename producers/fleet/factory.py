"""Building a fleet backend by name: the one module that knows every backend.

It stands above the backends (``local``, ``synthetic``) and below the runner: a backend imports
nothing of the fleet's package root, so every import here points down. Each backend is imported
when chosen: the local one brings the sandbox, the agents and redaction (about a second of imports
that ``import producers.fleet`` would otherwise pay).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.fleet.backends import BACKENDS, Fleet
from producers.fleet.perturb import Perturbation

if TYPE_CHECKING:
    from common.settings import Settings


def make_fleet(
    backend: str,
    settings: Settings,
    *,
    perturb: Perturbation | None = None,
    timeout_s: float | None = None,
    policy_mix: dict[str, float] | None = None,
    rate_per_s: float = 35.0,
    time_compression: float | None = None,
    start_us: int | None = None,
    host_id: str | None = None,
    agent: str | None = None,
    llm: Any = None,
    caps: Any = None,
    group_size: int = 1,
) -> Fleet:
    """Construct a backend by name (``agent``, ``llm``, ``caps``, ``group_size``: see ``run_fleet``).

    Raises:
        ValueError: unknown backend, or live-agent options for the synthetic backend.
        BubblewrapMissing: ``local`` without ``bwrap`` installed.
        AgentSpecError: an ``agent`` that does not resolve.
    """
    if backend == "local":
        from producers.fleet.local import LocalFleet, host_limits

        limits, bounds = host_limits(settings)
        return LocalFleet(
            settings.home_dir / "fleet",
            perturb=perturb,
            timeout_s=timeout_s,
            policy_mix=policy_mix,
            host_id=host_id,
            agent=agent,
            llm=llm,
            caps=caps,
            group_size=group_size,
            limits=limits,
            bounds=bounds,
        )
    if agent is not None or group_size != 1:
        raise ValueError("--agent and --group-size need --backend local (the synthetic fleet simulates its agents)")
    if backend == "synthetic":
        from producers.fleet.synthetic import SyntheticFleet

        return SyntheticFleet(
            rate_per_s=rate_per_s,
            time_compression=time_compression,
            start_us=start_us,
            perturb=perturb,
            host_id=host_id,
        )
    raise ValueError(f"unknown fleet backend {backend!r}; choose one of {', '.join(BACKENDS)}")
