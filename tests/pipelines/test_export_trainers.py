"""verl and SkyRL records from LLM sessions (scripted server on loopback, a test double at the network boundary).

Where the trainers' packages are installed (scripts/trainers.sh, a venv of its own), their own loaders take the
export as it is — verl's ``RLHFDataset`` a split's file, SkyRL's ``PromptDataset`` the directory — and their
record classes are built from the rows; Harbor's ATIF ``Trajectory`` takes the atif export. Everywhere, the
published field lists are checked and ``datasets.load_dataset(DIR)`` gives every format's splits as written;
a session whose model calls all failed is never an RL episode."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from common.settings import Settings, load_settings
from pipelines.assemble import assemble
from pipelines.export import ExportFilters, export_training_set, read_export
from pipelines.score import score_all
from producers.fleet import ListSink, run_fleet
from producers.fleet.agent_caps import Caps
from producers.fleet.llm import LLMConfig
from producers.fleet.llm.testing import FakeOpenAIServer, solver_script
from producers.fleet.sandbox import bwrap_available
from producers.fleet.tasks import task_for
from tests.helpers import write_raw
from warehouse.lakehouse import Lakehouse
from warehouse.query import run_query

ALL_ORIGINS = ExportFilters(origins=())  # the synthetic fleet's sessions too

# slow as a whole: the module's fixtures run real sandbox sessions once, and whichever test comes first pays for them
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap (Debian package `bubblewrap`) unusable"),
]

#: verl 0.9.1 ``AgentLoopOutput`` (required: prompt_ids, response_ids, response_mask, metrics) and SkyRL 0.3.1
#: ``TrajectoryOutput`` (a dataclass: every field required, no other accepted), as published.
VERL_FIELDS = {
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
}
SKYRL_FIELDS = {"prompt_ids", "response_ids", "loss_mask", "rollout_logprobs", "reward", "stop_reason", "env_metrics"}
#: the columns verl's ``RLHFDataset`` and SkyRL's ``PromptDataset`` read from a row
PROMPT_COLUMNS = {"prompt", "data_source"}
TRAINERS = Path(os.environ.get("TRAJLAKE_TRAINERS_VENV", Path.home() / ".cache" / "trajlake" / "trainers-venv"))
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Settings, dict[str, list[dict]]]:
    """Four tasks (distinct: not duplicates of each other): token in/token out, chat against a drifting
    template, every call failing, and token in/token out whose tokenize call fails."""
    settings = load_settings(
        home=tmp_path_factory.mktemp("trainers") / "home", topic="unused", kafka_bootstrap=None, catalog_uri=None
    )
    seeds = {"tito": 3, "chat": 4, "failed": 5, "failed_tito": 6, "capped": 7}
    tasks = [task_for(seed, 0) for seed in seeds.values()]
    events: list[dict] = []
    answers: dict[str, list[dict]] = {}
    for name, config in (
        ("tito", {"token_mode": "tito", "engine": "vllm"}),
        ("chat", {}),
        ("failed", {"max_retries": 1}),
        # token in/token out whose first tokenize call fails: no model call is ever made
        ("failed_tito", {"max_retries": 1, "token_mode": "tito", "engine": "vllm"}),
        ("capped", {}),  # stopped by max_model_calls before it could submit
    ):
        with FakeOpenAIServer(solver_script(tasks), drift=True) as server:
            if name.startswith("failed"):
                server.fail_next = [500] * 2
            sink = ListSink(decode=False)
            llm = LLMConfig(server.url, "policy-7b", backoff_s=0.01, **config)
            caps = Caps(max_model_calls=2) if name == "capped" else Caps()
            run_fleet(settings, "local", sessions=1, seed=seeds[name], sink=sink, agent="llm", llm=llm, caps=caps)
            answers[name] = [json.loads(body) for body in server.responses]
        answers[f"{name}_session"] = [{"session_id": sink.events[0]["session_id"]}]
        events += sink.events
    write_raw(settings, events)
    assemble(Lakehouse.open(settings))
    score_all(Lakehouse.open(settings))
    return settings, answers


def _export(settings: Settings, fmt: str, out: Path) -> list[dict]:
    stats = export_training_set(Lakehouse.open(settings), fmt, out, min_quality=0.0, filters=ALL_ORIGINS)
    records = read_export(out)
    assert stats.records == len(records)
    return records


def _session(answers: dict, name: str) -> str:
    return answers[f"{name}_session"][0]["session_id"]


def _by_session(records: list[dict], key: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for record in records:
        out.setdefault(record[key]["session_id"], []).append(record)
    return out


@pytest.mark.slow
def test_verl_records_are_agent_loop_outputs(lake, tmp_path):
    settings, answers = lake
    by_session = _by_session(_export(settings, "verl", tmp_path / "verl"), "extra_fields")
    assert _session(answers, "failed") not in by_session  # no successful call: no RL episode
    (tito,) = by_session[_session(answers, "tito")]  # one exact sequence: one record
    assert set(tito) == VERL_FIELDS | PROMPT_COLUMNS
    n = len(tito["response_ids"])
    assert len(tito["response_mask"]) == len(tito["response_logprobs"]) == n and 0 in tito["response_mask"]
    sampled = [t for t, m in zip(tito["response_ids"], tito["response_mask"], strict=True) if m]
    assert sampled == [t for a in answers["tito"] for t in a["choices"][0]["token_ids"]]
    assert tito["prompt_ids"] == answers["tito"][0]["choices"][0]["prompt_token_ids"]
    # verl's num_turns: the prompt's user turn + 6 assistant turns + 5 turns of tool results
    assert tito["num_turns"] == 12 and tito["extra_fields"]["segment"] is None
    assert tito["reward_score"] == 1.0 and tito["metrics"]["generate_sequences"] > 0
    chat = by_session[_session(answers, "chat")]  # the template rewrote history: one record per call, as sent
    assert [r["extra_fields"]["segment"] for r in chat] == list(range(6))
    for record, answer in zip(chat, answers["chat"], strict=True):
        assert record["prompt_ids"] == answer["prompt_token_ids"]
        assert record["response_ids"] == answer["choices"][0]["token_ids"]
        assert set(record["response_mask"]) == {1}


@pytest.mark.slow
def test_skyrl_records_are_trajectory_outputs_with_the_engines_stop_reason(lake, tmp_path):
    settings, answers = lake
    by_session = _by_session(_export(settings, "skyrl", tmp_path / "skyrl"), "env_metrics")
    assert _session(answers, "failed") not in by_session
    (tito,) = by_session[_session(answers, "tito")]
    assert set(tito) == SKYRL_FIELDS | PROMPT_COLUMNS and tito["stop_reason"] == "stop"  # never "terminal"
    assert len(tito["loss_mask"]) == len(tito["response_ids"]) == len(tito["rollout_logprobs"])
    assert tito["env_metrics"]["trajlake_stop_reason"] == "terminal" and tito["reward"] == 1.0
    assert {r["stop_reason"] for r in by_session[_session(answers, "chat")]} == {"stop"}


def test_a_session_whose_calls_all_failed_is_never_an_rl_episode(lake, tmp_path):
    settings, answers = lake
    failed = {_session(answers, "failed"), _session(answers, "failed_tito")}
    records = _export(settings, "rl", tmp_path / "rl")
    sessions = {r["session_id"] for r in records}  # rl: one record per segment, here one per chat-mode call
    capped = _session(answers, "capped")
    assert not failed & sessions and {_session(answers, "tito"), _session(answers, "chat")} <= sessions
    assert len([r for r in records if r["session_id"] != capped]) == 1 + len(answers["chat"])
    # by default it is left out as an infrastructure failure (the model API failed); asked for every
    # session, it is still no episode: nothing was sampled
    outcomes = json.loads((tmp_path / "rl" / "manifest.json").read_text())["counts"]["left_out"]["outcome"]
    assert outcomes == {"infrastructure": 2}
    export_training_set(
        Lakehouse.open(settings),
        "rl",
        tmp_path / "all",
        filters=ExportFilters(origins=(), min_quality=0.0, outcome="all"),
    )
    _, rows = run_query(settings, "SELECT session_id, reason FROM quarantine WHERE stage = 'export'")
    assert {(sid, reason) for sid, reason in rows if sid in failed} == {(sid, "no_model_call") for sid in failed}
    # the SFT formats are not RL episodes, but nothing sampled is no SFT record either, in either token mode
    for fmt in ("openai", "sharegpt"):
        out = tmp_path / f"{fmt}-all"
        export_training_set(
            Lakehouse.open(settings), fmt, out, filters=ExportFilters(origins=(), min_quality=0.0, outcome="all")
        )
        text = "\n".join(json.dumps(r) for r in read_export(out))
        assert text.strip() and not any(sid in text for sid in failed), fmt


def test_a_session_stopped_by_max_model_calls_is_a_truncated_episode(lake, tmp_path):
    settings, answers = lake
    capped = _session(answers, "capped")
    _, rows = run_query(settings, f"SELECT status, exit_reason FROM trajectories WHERE session_id = '{capped}'")
    assert rows == [("capped", "max_model_calls")]
    filters = ExportFilters(origins=(), min_quality=0.0, outcome="all")
    export_training_set(Lakehouse.open(settings), "rl", tmp_path / "rl", filters=filters)
    rl = read_export(tmp_path / "rl")
    ends = [r["stop_reason"] for r in rl if r["session_id"] == capped and r["is_last_segment"]]
    assert ends == ["truncated:max_model_calls"]
    export_training_set(Lakehouse.open(settings), "skyrl", tmp_path / "skyrl", filters=filters)
    skyrl = read_export(tmp_path / "skyrl")
    mine = [r for r in skyrl if r["env_metrics"]["session_id"] == capped]
    assert mine and mine[-1]["stop_reason"] == "length"  # SkyRL's truncated, never "stop"
    assert mine[-1]["env_metrics"]["trajlake_stop_reason"] == "truncated:max_model_calls"


def test_a_failed_tokenize_call_leaves_a_failed_model_call_event(lake):
    settings, answers = lake
    sid = _session(answers, "failed_tito")
    _, rows = run_query(
        settings,
        "SELECT agent_input.model_call.status, agent_input.model_call.error, "
        "agent_input.model_call.token_mode, agent_input.model_call.try_index "
        f"FROM events WHERE session_id = '{sid}' AND event_type = 'agent_input' ORDER BY seq",
    )
    assert [(r[0], r[2], r[3]) for r in rows] == [("error", "tito", 0), ("error", "tito", 1)]
    assert all(r[1].startswith("tokenize: ") and "500" in r[1] for r in rows)


def test_trainer_records_are_prompt_dataset_rows_and_every_format_loads_as_its_splits(lake, tmp_path):
    """verl and SkyRL records carry the session's opening turns as ``prompt`` (what their prompt datasets
    render); ``load_dataset(DIR)`` gives every format's splits, each row exactly the record written."""
    datasets = pytest.importorskip("datasets")
    settings, answers = lake
    rl = _export(settings, "rl", tmp_path / "rl")
    opening = {}
    for record in rl:
        if record["messages"]:
            messages = record["messages"]
            first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
            opening[record["session_id"]] = [{"role": m["role"], "content": m["content"]} for m in messages][
                : first_user + 1
            ]
    for fmt, key in (("verl", "extra_fields"), ("skyrl", "env_metrics")):
        records = _export(settings, fmt, tmp_path / fmt)
        assert records, fmt
        for record in records:
            prompt = record["prompt"]
            assert [m["role"] for m in prompt] == ["system", "user"] and all(m["content"] for m in prompt), fmt
            assert prompt == opening[record[key]["session_id"]], fmt
            assert record["data_source"] == f"trajlake/{record[key]['task_family']}", fmt
    for fmt in ("hf", "openai", "sharegpt", "rl", "verl", "skyrl", "atif"):
        out = tmp_path / f"all-{fmt}"
        export_training_set(
            Lakehouse.open(settings), fmt, out, filters=ExportFilters(origins=(), min_quality=0.0, outcome="all")
        )
        manifest = json.loads((out / "manifest.json").read_text())
        loaded = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))
        assert isinstance(loaded, datasets.DatasetDict), fmt
        files = [f for f in manifest["files"] if f.get("config", "default") == "default"]
        assert sorted(loaded) == sorted(f["split"] for f in files) and files, fmt
        for entry in files:
            split = loaded[entry["split"]]
            tolerant = {name for name, feature in split.features.items() if _holds_json(feature, datasets.Json)}
            written = [json.loads(line) for line in (out / entry["path"]).read_text().splitlines()]
            assert len(split) == len(written) == entry["records"], (fmt, entry["split"])
            for row, record in zip(split.to_list(), written, strict=True):
                assert row.keys() == record.keys(), fmt
                for name, value in record.items():
                    assert _same(row[name], value, ulp=name in tolerant), (fmt, name)


def _holds_json(feature: object, json_type: type) -> bool:
    """Whether a column's feature is, or holds, a ``datasets.Json`` (a list of them: ATIF's ``steps``)."""
    if isinstance(feature, json_type):
        return True
    if isinstance(feature, dict):
        return any(_holds_json(inner, json_type) for inner in feature.values())
    inner = getattr(feature, "feature", None)
    return inner is not None and _holds_json(inner, json_type)


def _same(loaded: object, written: object, ulp: bool) -> bool:
    """Equal; with ``ulp``, a float may differ in its last bit: ``datasets.Json`` columns are decoded with
    pandas' ujson, which reads -1.832661 as -1.8326609999999999 (typed columns are exact)."""
    if isinstance(written, float) and isinstance(loaded, float):
        return loaded == written or (ulp and abs(loaded - written) <= math.ulp(written))
    if isinstance(written, dict):
        return (
            isinstance(loaded, dict)
            and loaded.keys() == written.keys()
            and all(_same(loaded[k], v, ulp) for k, v in written.items())
        )
    if isinstance(written, list):
        return (
            isinstance(loaded, list)
            and len(loaded) == len(written)
            and all(_same(a, b, ulp) for a, b in zip(loaded, written, strict=True))
        )
    return loaded == written


#: Run in the trainers' venv: their own loaders and classes on an export, as a user's training run takes it.
LOADERS = """
import dataclasses, json, sys
from pathlib import Path

verl_dir, skyrl_dir, scripts, cache = (Path(a) for a in sys.argv[1:5])
sys.path.insert(0, str(scripts))
from omegaconf import OmegaConf
from tiny_model import ADDED, CHAT_TEMPLATE, SPECIAL
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.utils.dataset.rl_dataset import RLHFDataset
from skyrl_train.dataset.dataset import PromptDataset
from skyrl_train.generators.skyrl_gym_generator import TrajectoryOutput


def split_files(root):
    manifest = json.loads((root / "manifest.json").read_text())
    return [(f["split"], root / f["path"]) for f in manifest["files"] if f.get("config", "default") == "default"]


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line]


texts = [m["content"] for _, path in split_files(verl_dir) for r in lines(path) for m in r["prompt"]]
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(texts, trainers.BpeTrainer(
    vocab_size=512, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
tokenizer.add_tokens(ADDED)
tokenizer.chat_template = CHAT_TEMPLATE
report = {"verl": {}, "skyrl": {}}

# verl: data.train_files / data.val_files name a split's file; RLHFDataset renders each prompt with the
# chat template to filter overlong ones (a row it cannot render is dropped, so the count says it rendered)
config = OmegaConf.create({"max_prompt_length": 100000, "filter_overlong_prompts_workers": 1, "cache_dir": str(cache)})
for split, path in split_files(verl_dir):
    records = lines(path)
    dataset = RLHFDataset(str(path), tokenizer, config)
    assert len(dataset) == len(records), (split, len(dataset), len(records))
    for i, record in enumerate(records):
        row = dataset[i]
        assert row["raw_prompt"] == record["prompt"]
        for key in ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "reward_score"):
            assert row[key] == record[key], key
        output = AgentLoopOutput(**row)  # the loader's row as it is (pydantic ignores the dataset's own keys)
        assert output.model_dump() == AgentLoopOutput(**record).model_dump()
        assert len(output.response_mask) == len(output.response_ids) and output.prompt_ids == record["prompt_ids"]
        assert type(output.metrics).__name__ == "AgentLoopMetrics"
    report["verl"][split] = len(dataset)

# SkyRL: data.train_data = ["DIR:train"] loads the directory with datasets.load_dataset(DIR); the row's
# other columns are the environment's extras, here exactly TrajectoryOutput's fields and data_source
fields = [f.name for f in dataclasses.fields(TrajectoryOutput)]
for split, path in split_files(skyrl_dir):
    records = lines(path)
    dataset = PromptDataset([f"{skyrl_dir}:{split}"], tokenizer, max_prompt_length=100000, num_workers=1)
    assert len(dataset) == len(records), (split, len(dataset), len(records))
    for i, record in enumerate(records):
        messages, env_class, extras, _ = dataset[i]
        assert messages == record["prompt"] and env_class is None
        assert set(extras) == set(fields) | {"data_source"}, sorted(extras)
        output = TrajectoryOutput(**{k: extras[k] for k in fields})
        assert dataclasses.asdict(output) == {k: record[k] for k in fields}
        assert len(output.loss_mask) == len(output.response_ids)
    report["skyrl"][split] = len(dataset)
print(json.dumps(report))
"""


def _trainers_python() -> Path:
    python = TRAINERS / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no trainers venv at {TRAINERS} (scripts/trainers.sh): checked against the field lists only")
    return python


def _per_split(out: Path) -> dict[str, int]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {f["split"]: f["records"] for f in manifest["files"] if f.get("config", "default") == "default"}


def test_the_trainers_own_loaders_and_classes_take_the_export_directory(lake, tmp_path):
    """verl's ``RLHFDataset`` on each split's file and SkyRL's ``PromptDataset`` on ``DIR:<split>``, with no
    preprocessing; every row builds the trainer's own record class (verl ``AgentLoopOutput``, SkyRL
    ``TrajectoryOutput``) and carries the ids exactly."""
    python = _trainers_python()
    settings, _ = lake
    verl, skyrl = tmp_path / "verl", tmp_path / "skyrl"
    _export(settings, "verl", verl)
    _export(settings, "skyrl", skyrl)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "RAY_DISABLE_IMPORT_WARNING": "1"}
    result = subprocess.run(
        [python, "-c", LOADERS, verl, skyrl, ROOT / "scripts", tmp_path / "verl-cache"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"verl": _per_split(verl), "skyrl": _per_split(skyrl)}
    assert sum(report["verl"].values()) > 1 and sum(report["skyrl"].values()) > 1


HARBOR = """
import json, sys
from harbor.models.trajectories import Trajectory
n = 0
for path in sys.argv[1:]:
    for line in open(path):
        trajectory = Trajectory.model_validate_json(line)  # extra keys are refused at every level
        # every field as written, nothing coerced or dropped
        assert trajectory.model_dump(mode="json", exclude_none=True) == json.loads(line), path
        n += 1
print(n)
"""


def test_harbors_own_trajectory_model_validates_the_atif_export(lake, tmp_path):
    """Harbor's pydantic ``Trajectory`` (ATIF; extra keys forbidden throughout) takes every exported line and
    gives it back field for field."""
    python = _trainers_python()
    probe = subprocess.run([python, "-c", "import harbor.models.trajectories"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"harbor is not installed in {TRAINERS} (scripts/trainers.sh)")
    settings, _ = lake
    out = tmp_path / "atif"
    export_training_set(
        Lakehouse.open(settings), "atif", out, filters=ExportFilters(origins=(), min_quality=0.0, outcome="all")
    )
    manifest = json.loads((out / "manifest.json").read_text())
    paths = [out / f["path"] for f in manifest["files"] if f.get("config", "default") == "default"]
    result = subprocess.run([python, "-c", HARBOR, *paths], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert int(result.stdout.split()[-1]) == sum(_per_split(out).values()) > 0
