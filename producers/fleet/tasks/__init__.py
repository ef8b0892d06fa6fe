"""The task pack: small coding tasks whose every instance is randomized from a seed.

Three task types, each with its own pinned image: ``bugfix`` (fix a bug so the tests pass),
``implement`` (implement a function from a spec), ``data_cli`` (a data-wrangling command-line
tool). Each family's generator draws names, constants and data from ``random.Random(seed)``, so
an answer cannot be memorized, and the same seed always gives the same instance.

A ``TaskInstance`` carries the agent's workspace (source, visible tests), the hidden tests as
structured cases (``HiddenCase``: an input the evaluator hands to the sandbox and an expected
outcome that never leaves the host, see ``producers.fleet.evaluator``) and, for reading, the same
cases as a test file; the deliverable paths the evaluator takes from the agent, a reference
solution and a plausible wrong guess (used by the scripted agents), and optional egress allowlist
with the internal services behind it. ``producers.fleet.tasks.repo`` turns a workspace into a git
repository whose history also holds the fix (an honest agent never needs it).
"""

# Importing a family registers it in ``FAMILIES``.
from producers.fleet.tasks import bugfix, data_cli, implement  # noqa: F401
from producers.fleet.tasks.base import (
    FAMILIES,
    IMAGES,
    WORDS,
    HiddenCase,
    TaskInstance,
    call_cases,
    family,
    ident,
    make_id,
    make_task,
    task_for,
    unit_tests,
)

__all__ = [
    "FAMILIES",
    "IMAGES",
    "WORDS",
    "HiddenCase",
    "TaskInstance",
    "call_cases",
    "family",
    "ident",
    "make_id",
    "make_task",
    "task_for",
    "unit_tests",
]
