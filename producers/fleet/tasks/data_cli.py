# ruff: noqa: E501  (this module is mostly source-code templates of generated task files)
"""``data_cli`` tasks: write ``tool.py``, a command-line tool over a CSV file (stdlib only).

The visible tests run the tool on the workspace's data file; the hidden tests run it on other
randomized data, so hard-coding the visible answer fails evaluation. ``data_cli.fx`` needs the
network: exchange rates come from an internal service on the task type's egress allowlist.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Callable

from producers.fleet.tasks.base import WORDS, HiddenCase, TaskInstance, family, ident, make_id

STUB = 'import sys\n\n\ndef main(argv):\n    """See README.md."""\n    raise SystemExit("not implemented")\n\n\nif __name__ == "__main__":\n    main(sys.argv[1:])\n'
HARNESS = (
    "import os\nimport subprocess\nimport sys\nimport tempfile\n\n\n"
    "def run_tool(csv_text):\n"
    "    fd, path = tempfile.mkstemp(suffix='.csv')\n"
    "    with os.fdopen(fd, 'w') as handle:\n        handle.write(csv_text)\n"
    "    done = subprocess.run([sys.executable, 'tool.py', path], capture_output=True, text=True, timeout=30)\n"
    "    return done.stdout.strip().splitlines()\n"
)


def _tests(datasets: list[tuple[str, list[str]]], prefix: str) -> str:
    parts = [HARNESS]
    for i, (csv_text, expected) in enumerate(datasets):
        parts.append(f"\n\ndef test_{prefix}_{i}():\n    assert run_tool({csv_text!r}) == {expected!r}\n")
    return "".join(parts)


def _data_cli(
    name: str,
    seed: int,
    rng: random.Random,
    readme: str,
    solution: str,
    wrong: str,
    make_data: Callable[[], str],
    reference: Callable[[str], list[str]],
    egress_allowlist: tuple[str, ...] = (),
    services: dict[str, dict[str, str]] | None = None,
) -> TaskInstance:
    data_name = f"data/{ident(rng)}.csv"
    visible = make_data()
    hidden = [make_data() for _ in range(3)]
    visible_test = (
        HARNESS + f"\n\ndef test_visible_data():\n    with open({data_name!r}) as handle:\n"
        f"        assert run_tool(handle.read()) == {reference(visible)!r}\n"
    )
    hidden_sets = hidden + [visible]
    cases = tuple(
        HiddenCase(f"test_hidden_{i}", "cli", {"script": "tool.py", "csv": d}, reference(d))
        for i, d in enumerate(hidden_sets)
    )
    return TaskInstance(
        task_id=make_id(name, seed),
        task_type="data_cli",
        family=name,
        seed=seed,
        instruction=f"Write tool.py as described in README.md; try it on {data_name}. "
        "`python3 run_tests.py` runs the tests. Only tool.py is submitted.",
        files={"tool.py": STUB, "README.md": readme, data_name: visible, "tests/test_visible.py": visible_test},
        hidden_tests={"test_hidden.py": _tests([(d, reference(d)) for d in hidden_sets], "hidden")},
        hidden_cases=cases,
        deliverables=("tool.py",),
        solution={"tool.py": solution},
        wrong_guess={"tool.py": wrong},  # a plausible buggy tool (hard-coding answers is a cheat, not a guess)
        config={"TL_TASK_FAMILY": name, "TL_DATA_FILE": data_name},
        egress_allowlist=egress_allowlist,
        services=services or {},
    )


@family("data_cli.group_sum")
def group_sum(rng: random.Random, seed: int) -> TaskInstance:
    """Sum a value column per key."""
    key, value = ident(rng, 1), ident(rng, 1) + "_qty"
    keys = rng.sample(WORDS, 5)

    def make_data() -> str:
        rows = [f"{rng.choice(keys)},{rng.randint(-20, 500)}" for _ in range(rng.randint(8, 25))]
        return "\n".join([f"{key},{value}", *rows]) + "\n"

    def reference(text: str) -> list[str]:
        totals: dict[str, int] = defaultdict(int)
        for line in text.strip().splitlines()[1:]:
            k, v = line.split(",")
            totals[k] += int(v)
        return [f"{k},{totals[k]}" for k in sorted(totals)]

    readme = (
        f"# tool.py\n\n`python3 tool.py FILE.csv` reads a CSV with header `{key},{value}` and prints one line "
        f"`<{key}>,<sum of {value}>` per distinct {key}, sorted by {key}.\n"
    )
    solution = (
        "import csv\nimport sys\n\ntotals = {}\nwith open(sys.argv[1]) as handle:\n"
        "    for row in csv.DictReader(handle):\n"
        f"        totals[row[{key!r}]] = totals.get(row[{key!r}], 0) + int(row[{value!r}])\n"
        "for k in sorted(totals):\n    print(f'{k},{totals[k]}')\n"
    )
    wrong = solution.replace("for k in sorted(totals):", "for k in sorted(totals, reverse=True):")
    return _data_cli("data_cli.group_sum", seed, rng, readme, solution, wrong, make_data, reference)


@family("data_cli.threshold")
def threshold(rng: random.Random, seed: int) -> TaskInstance:
    """Count rows above a threshold per category."""
    cat, val, limit, sep = ident(rng, 1), ident(rng, 1) + "_ms", rng.randint(100, 900), rng.choice([":", "=", " "])
    cats = rng.sample(WORDS, 4)

    def make_data() -> str:
        rows = [
            f"{rng.randint(1, 99999)},{rng.choice(cats)},{rng.randint(0, 1000)}" for _ in range(rng.randint(10, 30))
        ]
        return "\n".join([f"id,{cat},{val}", *rows]) + "\n"

    def reference(text: str) -> list[str]:
        counts: Counter[str] = Counter()
        for line in text.strip().splitlines()[1:]:
            _, c, v = line.split(",")
            if int(v) > limit:
                counts[c] += 1
        return [f"{c}{sep}{n}" for c, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]

    readme = (
        f"# tool.py\n\n`python3 tool.py FILE.csv` reads a CSV with header `id,{cat},{val}` and, for each {cat} "
        f"with at least one row whose {val} is greater than {limit}, prints `<{cat}>{sep}<count of such rows>`, "
        f"by count descending then {cat} ascending.\n"
    )
    solution = (
        "import csv\nimport sys\n\ncounts = {}\nwith open(sys.argv[1]) as handle:\n"
        "    for row in csv.DictReader(handle):\n"
        f"        if int(row[{val!r}]) > {limit}:\n"
        f"            counts[row[{cat!r}]] = counts.get(row[{cat!r}], 0) + 1\n"
        "for c, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])):\n"
        f"    print(f'{{c}}{sep}{{n}}')\n"
    )
    wrong = solution.replace(f"if int(row[{val!r}]) > {limit}:", f"if int(row[{val!r}]) < {limit}:")
    return _data_cli("data_cli.threshold", seed, rng, readme, solution, wrong, make_data, reference)


@family("data_cli.top_k")
def top_k(rng: random.Random, seed: int) -> TaskInstance:
    """Top-k names by score, ties by name."""
    k, score = rng.randint(2, 5), ident(rng, 1) + "_score"

    def make_data() -> str:
        names = rng.sample([f"{a}{b}" for a in WORDS[:10] for b in ("", "x", "y")], rng.randint(k + 2, 14))
        rows = [f"{n},{rng.randint(0, 30)}" for n in names]
        return "\n".join([f"name,{score}", *rows]) + "\n"

    def reference(text: str) -> list[str]:
        rows = [line.split(",") for line in text.strip().splitlines()[1:]]
        ranked = sorted(rows, key=lambda r: (-int(r[1]), r[0]))
        return [r[0] for r in ranked[:k]]

    readme = (
        f"# tool.py\n\n`python3 tool.py FILE.csv` reads a CSV with header `name,{score}` and prints the {k} names "
        f"with the highest {score}, one per line, ties broken by name ascending.\n"
    )
    solution = (
        "import csv\nimport sys\n\nwith open(sys.argv[1]) as handle:\n    rows = list(csv.DictReader(handle))\n"
        f"rows.sort(key=lambda r: (-int(r[{score!r}]), r['name']))\n"
        f"for row in rows[:{k}]:\n    print(row['name'])\n"
    )
    wrong = solution.replace(
        f"rows.sort(key=lambda r: (-int(r[{score!r}]), r['name']))",
        f"rows.sort(key=lambda r: (int(r[{score!r}]), r['name']))",
    )
    return _data_cli("data_cli.top_k", seed, rng, readme, solution, wrong, make_data, reference)


@family("data_cli.fx")
def fx(rng: random.Random, seed: int) -> TaskInstance:
    """Convert amounts with rates fetched from an allowlisted internal service."""
    target = rng.choice(["USD", "EUR", "CHF"])
    currencies = ["USD", "EUR", "CHF", "GBP", "JPY"]
    rates = {c: (1.0 if c == target else round(rng.uniform(0.005, 2.0), 4)) for c in currencies}
    host = "rates.internal"
    url = f"http://{host}/v1/rates.json"

    def make_data() -> str:
        rows = [f"{rng.randint(1, 5000) / 100:.2f},{rng.choice(currencies)}" for _ in range(rng.randint(5, 15))]
        return "\n".join(["amount,currency", *rows]) + "\n"

    def reference(text: str) -> list[str]:
        total = 0.0
        for line in text.strip().splitlines()[1:]:
            amount, currency = line.split(",")
            total += float(amount) * rates[currency]
        return [f"TOTAL {target} {total:.2f}"]

    readme = (
        f"# tool.py\n\n`python3 tool.py FILE.csv` reads a CSV with header `amount,currency`, fetches the rates "
        f"JSON from {url} (an object: currency → {target} per unit; the sandbox may reach this host only) "
        f"and prints `TOTAL {target} <sum of amount * rate, 2 decimals>`.\n"
    )
    solution = (
        "import csv\nimport json\nimport sys\nimport urllib.request\n\n"
        f"rates = json.loads(urllib.request.urlopen({url!r}, timeout=10).read())\n"
        "total = 0.0\nwith open(sys.argv[1]) as handle:\n    for row in csv.DictReader(handle):\n"
        "        total += float(row['amount']) * rates[row['currency']]\n"
        f"print(f'TOTAL {target} {{total:.2f}}')\n"
    )
    wrong = solution.replace("float(row['amount']) * rates[row['currency']]", "float(row['amount'])")
    return _data_cli(
        "data_cli.fx",
        seed,
        rng,
        readme,
        solution,
        wrong,
        make_data,
        reference,
        egress_allowlist=(f"{host}:80",),
        services={f"{host}:80": {"/v1/rates.json": json.dumps(rates)}},
    )
