"""Task pack: determinism, randomization, and the solution/wrong-guess/pristine contract."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from producers.fleet.evaluator import judge_case
from producers.fleet.perturb import Perturbation
from producers.fleet.sandbox import CommandResult, ImageConflict, ImageStore, image_tools
from producers.fleet.tasks import FAMILIES, IMAGES, make_task, task_for
from producers.fleet.tasks.repo import init_repository

RUNNER = Path(__file__).resolve().parents[3] / "producers" / "fleet" / "image" / "tl_test.py"


def _run(task, files: dict[str, str], tmp: Path) -> tuple[int, int]:
    """Exit codes of the visible and the hidden tests on ``files`` (no sandbox)."""
    for rel, text in {**task.files, **files}.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    hidden = tmp / "_hidden"
    hidden.mkdir()
    for name, text in task.hidden_tests.items():
        (hidden / name).write_text(text)
    visible = subprocess.run([sys.executable, str(RUNNER), "tests"], cwd=tmp, capture_output=True)
    secret = subprocess.run(
        [sys.executable, str(RUNNER), str(hidden), "--root", str(tmp)], cwd=tmp, capture_output=True
    )
    return visible.returncode, secret.returncode


def test_pack_size_and_types():
    assert len(FAMILIES) >= 12
    types = {make_task(name, 0).task_type for name in FAMILIES}
    assert types == set(IMAGES) and len(types) >= 3


def test_same_seed_same_instance_other_seed_differs():
    for name in FAMILIES:
        assert make_task(name, 7) == make_task(name, 7)
        assert make_task(name, 7).files != make_task(name, 8).files
    assert task_for(3, 5) == task_for(3, 5)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_solution_passes_pristine_and_guess_fail(name, tmp_path):
    task = make_task(name, 11)
    if task.egress_allowlist:
        pytest.skip("needs the sandbox's egress gateway (covered by the local fleet tests)")
    for variant, files, expect_hidden in (
        ("pristine", {}, 1),
        ("solution", task.solution, 0),
        ("wrong", task.wrong_guess, 1),
    ):
        work = tmp_path / variant
        work.mkdir()
        visible, hidden = _run(task, files, work)
        assert hidden == expect_hidden, (variant, visible, hidden)
        if variant != "wrong":
            assert visible == expect_hidden, (variant, visible)


def _probe(task, files: dict[str, str], tmp: Path) -> list[str]:
    """Outcomes of every hidden case judged on the host, the probe run without a sandbox in ``tmp``."""
    for rel, text in {**task.files, **files}.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    outcomes = []
    for i, case in enumerate(task.hidden_cases):
        nonce = f"n{i}"
        request = {"id": case.test_id, "nonce": nonce, "kind": case.kind, "inputs": case.inputs}
        done = subprocess.run(
            [sys.executable, str(RUNNER), "--case"],
            cwd=tmp,
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=60,
        )
        run = CommandResult(done.stdout + done.stderr, done.returncode, 0.0, len(done.stdout))
        record, evidence, reported = judge_case(case, nonce, run)
        assert reported and not evidence, (record, evidence, done.stderr[-500:])
        outcomes.append(record["outcome"])
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hidden_cases_match_the_hidden_tests(name, tmp_path):
    task = make_task(name, 13)
    ids = [c.test_id for c in task.hidden_cases]
    assert len(ids) == len(set(ids)) > 0
    text = "".join(task.hidden_tests.values())
    assert all(f"def {test_id}(" in text for test_id in ids)  # the same tests, structured
    for case in task.hidden_cases:  # JSON both ways: the input goes to the sandbox, the expectation stays
        assert json.dumps(case.inputs) and json.dumps(case.expected)
        assert case.kind in ("call", "cli")
    if task.egress_allowlist:
        pytest.skip("needs the sandbox's egress gateway (covered by the evaluator tests)")
    (tmp_path / "good").mkdir()
    (tmp_path / "bad").mkdir()
    assert set(_probe(task, task.solution, tmp_path / "good")) == {"passed"}
    assert "failed" in _probe(task, task.wrong_guess, tmp_path / "bad")


def test_wrong_guesses_are_honest_attempts_not_hard_coded_answers():
    for name in FAMILIES:
        task = make_task(name, 5)
        for path, text in task.wrong_guess.items():
            for case in task.hidden_cases:
                if case.kind == "cli":
                    assert not any(line in text for line in case.expected), (name, path)


def test_workspace_repository_hides_the_fix_in_history(tmp_path):
    task = make_task("bugfix.range_sum", 17)
    for run in ("a", "b"):
        work = tmp_path / run
        for rel, text in task.files.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        info = init_repository(work, task)
        assert {rel: (work / rel).read_text() for rel in task.files} == task.files  # the checkout is pristine

        def git(*args, cwd=work):
            return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout

        assert git("rev-parse", "HEAD").strip() == info.pristine_commit != info.fix_commit
        assert git("status", "--porcelain") == ""
        assert info.fix_commit[:7] not in git("log", "--oneline")  # not on the checked-out branch
        assert info.fix_commit[:7] in git("log", "--all", "--oneline")  # but reachable
        assert info.fix_commit[:7] in git("reflog")
        for path, text in task.solution.items():
            assert git("show", f"{info.fix_commit}:{path}") == text
        if run == "a":
            first = info
    assert (first.pristine_commit, first.fix_commit) == (info.pristine_commit, info.fix_commit)  # deterministic


def test_hidden_tests_are_not_in_the_workspace():
    for name in FAMILIES:
        task = make_task(name, 1)
        assert not set(task.hidden_tests) & set(task.files)
        for text in task.hidden_tests.values():
            assert text not in task.files.values()


def test_image_versions_are_immutable(tmp_path):
    store = ImageStore(tmp_path)
    v1 = store.ensure("trajlake/x", "1.0.0")
    digest = (v1 / "MANIFEST.json").read_text()
    assert store.ensure("trajlake/x", "1.0.0") == v1
    changed = {**image_tools(), "bin/extra.py": b"print(1)\n"}
    with pytest.raises(ImageConflict):
        store.ensure("trajlake/x", "1.0.0", changed)
    v2 = store.ensure("trajlake/x", "1.1.0", changed)
    assert v2 != v1 and (v1 / "MANIFEST.json").read_text() == digest and not (v1 / "bin" / "extra.py").exists()


def test_perturbation_spec():
    assert Perturbation.parse(None) == Perturbation()
    p = Perturbation.parse("latency=50,jitter=20,fail=0.1,formats")
    assert (p.latency_ms, p.jitter_ms, p.failure_rate, p.format_variation) == (50, 20, 0.1, True)
    with pytest.raises(ValueError):
        Perturbation.parse("bogus=1")
