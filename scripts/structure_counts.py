"""Count what issue 41 measures: how far ``Settings`` travels, where tables are ensured, long functions.

Run from the repository root: ``.venv/bin/python scripts/structure_counts.py`` (``--list`` names each hit).

- signatures with a parameter annotated ``Settings`` (any name), per package; the total excludes the
  command line (``trajlake/``), the Dagster resources (``dagster_project/resources.py``) and the settings
  module itself (``common/settings.py``), which are where settings are meant to be read;
- call sites of ``ensure_table(`` (and, separately, ``ensure_cold_table(``);
- functions longer than 80 lines (``def`` to last line, decorators not counted);
- lines per top-level package (every ``*.py`` line).

McCabe complexity is ruff's: ``ruff check --select C901 --config 'lint.mccabe.max-complexity=15' --exclude tests``.
Tests are left out of every count.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "schemas", "warehouse", "quality", "producers", "pipelines", "trajlake", "dagster_project")
EXTRA = ("benchmarks", "scripts")
#: Where settings are meant to be read: not counted in the total.
SETTINGS_HOMES = ("trajlake/", "dagster_project/resources.py", "common/settings.py")


def _files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if ".venv" not in p.parts)


def _annotation_names(node: ast.expr | None) -> set[str]:
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _takes_settings(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *[p for p in (a.vararg, a.kwarg) if p is not None]]
    return any("Settings" in _annotation_names(p.annotation) for p in params)


def _called(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def count() -> dict[str, object]:
    settings_sigs: list[str] = []
    ensure: list[str] = []
    ensure_cold: list[str] = []
    long_fns: list[str] = []
    lines: Counter[str] = Counter()
    for package in PACKAGES + EXTRA:
        for path in _files(package):
            text = path.read_text()
            rel = str(path.relative_to(ROOT))
            lines[package] += text.count("\n")
            for node in ast.walk(ast.parse(text, rel)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    where = f"{rel}:{node.lineno} {node.name}"
                    if _takes_settings(node):
                        settings_sigs.append(where)
                    if (node.end_lineno or node.lineno) - node.lineno + 1 > 80:
                        long_fns.append(where)
                elif isinstance(node, ast.Call):
                    name = _called(node)
                    if name == "ensure_table":
                        ensure.append(f"{rel}:{node.lineno}")
                    elif name == "ensure_cold_table":
                        ensure_cold.append(f"{rel}:{node.lineno}")
    outside = [s for s in settings_sigs if not s.startswith(SETTINGS_HOMES)]
    return {
        "settings_signatures_outside_cli_resources_settings": outside,
        "settings_signatures_all": settings_sigs,
        "ensure_table_calls": ensure,
        "ensure_cold_table_calls": ensure_cold,
        "functions_over_80_lines": long_fns,
        "lines": lines,
    }


def main(argv: list[str]) -> None:
    found = count()
    listing = "--list" in argv
    out = sys.stdout
    for key, value in found.items():
        if isinstance(value, Counter):
            out.write(f"{key}: {sum(value.values())}\n")
            for package, n in sorted(value.items(), key=lambda kv: -kv[1]):
                out.write(f"  {package:<16}{n:>7}\n")
            continue
        assert isinstance(value, list)
        out.write(f"{key}: {len(value)}\n")
        per = Counter(v.split("/")[0] if "/" in v else v.split(":")[0] for v in value)
        out.write("  " + ", ".join(f"{p} {n}" for p, n in sorted(per.items(), key=lambda kv: -kv[1])) + "\n")
        if listing:
            out.writelines(f"    {v}\n" for v in value)


if __name__ == "__main__":
    main(sys.argv[1:])
