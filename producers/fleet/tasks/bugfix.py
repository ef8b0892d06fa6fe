"""``bugfix`` tasks: a module with one bug; fix it so the tests pass (tests are not to be edited)."""

from __future__ import annotations

import random
import statistics

from producers.fleet.tasks.base import TaskInstance, call_cases, family, ident, make_id, unit_tests

INSTRUCTION = (
    "The tests in tests/ fail. Fix the bug in {module}.py so that `python3 run_tests.py` passes. "
    "Do not edit the tests or the runner; only {module}.py is submitted."
)


def _bugfix(
    name: str, seed: int, module: str, func: str, buggy: str, fixed: str, wrong: str, visible: list, hidden: list
) -> TaskInstance:
    path = f"{module}.py"
    return TaskInstance(
        task_id=make_id(name, seed),
        task_type="bugfix",
        family=name,
        seed=seed,
        instruction=INSTRUCTION.format(module=module),
        files={path: buggy, "tests/test_visible.py": unit_tests(module, func, visible, "visible")},
        hidden_tests={"test_hidden.py": unit_tests(module, func, hidden + visible, "hidden")},
        hidden_cases=call_cases(module, func, hidden + visible, "hidden"),
        deliverables=(path,),
        solution={path: fixed},
        wrong_guess={path: wrong},
        config={"TL_TASK_FAMILY": name},
    )


@family("bugfix.range_sum")
def range_sum(rng: random.Random, seed: int) -> TaskInstance:
    """Sum of a scaled inclusive integer range; the bug drops the upper bound."""
    module, func, k = ident(rng), ident(rng, 1) + "_total", rng.randint(2, 9)
    template = (
        f'def {func}(lo, hi):\n    """Sum of i * {k} for every integer i from lo to hi, both inclusive."""\n'
        "    return sum(i * {k} for i in range({r}))\n"
    )
    cases = []
    for _ in range(8):
        lo = rng.randint(1, 40)
        hi = lo + rng.randint(1, 30)
        cases.append(((lo, hi), sum(i * k for i in range(lo, hi + 1))))
    return _bugfix(
        "bugfix.range_sum",
        seed,
        module,
        func,
        template.format(k=k, r="lo, hi"),
        template.format(k=k, r="lo, hi + 1"),
        template.format(k=k, r="lo + 1, hi + 1"),
        cases[:3],
        cases[3:],
    )


@family("bugfix.clamp")
def clamp(rng: random.Random, seed: int) -> TaskInstance:
    """Clamp then offset; the bug swaps min and max."""
    module, func, off = ident(rng), "limit_" + ident(rng, 1), rng.randint(-50, 50)
    template = (
        f'def {func}(x, lo, hi):\n    """x limited to the range [lo, hi], then plus {off}."""\n'
        "    return {body} + ({off})\n"
    )
    cases = []
    for _ in range(8):
        lo = rng.randint(-100, 100)
        hi = lo + rng.randint(5, 100)
        x = rng.choice([rng.randint(lo + 1, hi - 1), lo - rng.randint(1, 50), hi + rng.randint(1, 50)])
        cases.append(((x, lo, hi), max(lo, min(hi, x)) + off))
    cases[0] = ((cases[0][0][1] + 1,) + cases[0][0][1:], cases[0][0][1] + 1 + off)
    return _bugfix(
        "bugfix.clamp",
        seed,
        module,
        func,
        template.format(body="max(hi, min(lo, x))", off=off),
        template.format(body="max(lo, min(hi, x))", off=off),
        template.format(body="min(lo, max(hi, x))", off=off),
        cases[:3],
        cases[3:],
    )


@family("bugfix.median")
def median(rng: random.Random, seed: int) -> TaskInstance:
    """Median of values at or above a floor; the bug mishandles even lengths."""
    module, func, floor = ident(rng), ident(rng, 1) + "_median", rng.randint(0, 20)
    template = (
        f'def {func}(values):\n    """Median of the values >= {floor} (mean of the middle two for even counts)."""\n'
        f"    s = sorted(v for v in values if v >= {floor})\n"
        "    n = len(s)\n{body}"
    )
    fixed = "    if n % 2:\n        return s[n // 2]\n    return (s[n // 2 - 1] + s[n // 2]) / 2\n"
    buggy = "    return s[n // 2]\n"
    wrong = "    return s[(n - 1) // 2]\n"
    cases = []
    for i in range(8):
        n = 2 * rng.randint(2, 6) + (i % 3 == 2)
        values = rng.sample(range(floor, floor + 200), n) + [floor - rng.randint(1, 5)]
        rng.shuffle(values)
        cases.append(((values,), statistics.median(v for v in values if v >= floor)))
    return _bugfix(
        "bugfix.median",
        seed,
        module,
        func,
        template.format(body=buggy),
        template.format(body=fixed),
        template.format(body=wrong),
        cases[:3],
        cases[3:],
    )


@family("bugfix.percent_change")
def percent_change(rng: random.Random, seed: int) -> TaskInstance:
    """Rounded percentage change; the bug divides by the new value."""
    module, func, digits = ident(rng), "pct_" + ident(rng, 1), rng.randint(1, 4)
    template = (
        f'def {func}(old, new):\n    """Percentage change from old to new, rounded to {digits} digits."""\n'
        f"    return round({{expr}} * 100, {digits})\n"
    )
    cases = []
    for _ in range(8):
        old = rng.randint(10, 900)
        new = old + rng.choice([-1, 1]) * rng.randint(1, 300)
        cases.append(((old, new), round((new - old) / old * 100, digits)))
    return _bugfix(
        "bugfix.percent_change",
        seed,
        module,
        func,
        template.format(expr="(new - old) / new"),
        template.format(expr="(new - old) / old"),
        template.format(expr="(old - new) / old"),
        cases[:3],
        cases[3:],
    )
