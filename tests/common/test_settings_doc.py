"""One source for each setting: the configuration reference is generated from ``Settings`` and cannot drift."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from common.settings import Settings, settings_reference

ROOT = Path(__file__).resolve().parents[2]
#: Variables read outside Settings on purpose (before settings load, or by the test and bench tooling).
NOT_SETTINGS = {
    "TRAJLAKE_FAULT",
    "TRAJLAKE_EXPORT_CRASH_AT",  # the export's named kill points (tests/pipelines/test_export_dataset.py)
    "TRAJLAKE_UI_ALLOWED_HOSTS",  # set by `trajlake ui` for the Dagster processes it starts (trajlake/ui_env.py)
    "TRAJLAKE_LOG_LEVEL",
    "TRAJLAKE_TEST_WORKERS",
    "TRAJLAKE_UI_SCREENSHOTS",
    "TRAJLAKE_REPORT_SCREENSHOT",  # tests/trajlake/test_show_report.py keeps the report's screenshot
    "TRAJLAKE_FUZZ_EXAMPLES",
    "TRAJLAKE_STRESS_TESTS",  # tests/conftest.py: the test tiers
    "TRAJLAKE_UNMARKED_LIMIT_S",
    "TRAJLAKE_KAFKA_JAVA",
    "TRAJLAKE_KAFKA_MVN",
    "TRAJLAKE_VLLM_VENV",  # scripts/vllm.sh and the real-server test
    "TRAJLAKE_VLLM_URL",
    "TRAJLAKE_TRAINERS_VENV",  # scripts/trainers.sh and the trainer-record test
}


def test_the_configuration_document_is_the_generated_table() -> None:
    doc = ROOT / "docs" / "configuration.md"
    script = runpy.run_path(str(ROOT / "scripts" / "settings_doc.py"))
    assert doc.read_text() == script["rewrite"](doc.read_text()), "run: python scripts/settings_doc.py"


def test_every_setting_says_what_it_means() -> None:
    vague = [variable for variable, _, meaning in settings_reference() if len(meaning.split()) < 3]
    assert vague == []


def test_a_description_naming_a_variable_names_its_own() -> None:
    wrong = []
    for name, field in Settings.model_fields.items():
        label = re.match(r"(TRAJLAKE_[A-Z0-9_]+)", field.description or "")
        if label and label.group(1) != f"TRAJLAKE_{name.upper()}":
            wrong.append((name, label.group(1)))
    assert wrong == []


def test_every_variable_the_docs_mention_exists() -> None:
    known = {variable for variable, _, _ in settings_reference()} | NOT_SETTINGS
    unknown: dict[str, list[str]] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for variable in set(re.findall(r"TRAJLAKE_[A-Z0-9_]*[A-Z0-9]", path.read_text())):
            # "TRAJLAKE_QUALITY_MAX_FLAG_RATE / _MAX_DUPLICATE_RATE" style abbreviations name a prefix
            if variable not in known and not any(k.startswith(variable + "_") for k in known):
                unknown.setdefault(path.name, []).append(variable)
    assert unknown == {}
