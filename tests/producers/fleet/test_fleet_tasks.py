"""Task pack: determinism, randomization, and the solution/wrong-guess/pristine contract."""

import subprocess
import sys
from pathlib import Path

import pytest

from producers.fleet.perturb import Perturbation
from producers.fleet.sandbox import ImageConflict, ImageStore, image_tools
from producers.fleet.tasks import FAMILIES, IMAGES, make_task, task_for

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
        [sys.executable, str(RUNNER), str(hidden), "--json", "--root", str(tmp)], cwd=tmp, capture_output=True
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
