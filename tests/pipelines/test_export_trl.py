"""A real trainer takes an export as it comes: TRL's ``SFTTrainer`` on ``load_dataset(DIR)["train"]``.

A tiny causal LM (Qwen2-shaped, two layers) and a byte-level BPE tokenizer are built here from
nothing (no weights can be downloaded); the chat template marks assistant output, end-of-turn
token included, with ``{% generation %}`` so TRL computes an assistant-only loss. The dataset is
the default SFT export of real sandbox sessions (``test_export_dataset``'s lakehouse), passed to
the trainer without any preprocessing, tools included. Skipped (with the reason) where torch,
transformers, TRL or tokenizers are not installed (``pip install -e '.[train]'``).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from pipelines.export import export_training_set, read_export
from tests.pipelines.test_export_dataset import lake  # noqa: F401  (the module's lakehouse fixture)
from warehouse.lakehouse import Lakehouse

#: The training stack this test needs (``pip install -e '.[train]'``), looked up without importing it, so a
#: machine without it skips before the lakehouse fixture is built.
MISSING = [name for name in ("torch", "transformers", "trl", "tokenizers") if importlib.util.find_spec(name) is None]

pytestmark = [
    pytest.mark.slow,
    # the lakehouse fixture (real sandbox sessions) and six CPU steps: minutes on two loaded cores
    pytest.mark.timeout(1800),
    pytest.mark.skipif(bool(MISSING), reason=f"{', '.join(MISSING)} not installed (pip install -e '.[train]')"),
]

#: A ChatML-like template: tools as JSON, tool calls with their JSON-string arguments, and every
#: assistant turn (its end-of-turn token too) inside a generation block.
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ message['content'] or '' }}"
    "{%- for call in message['tool_calls'] or [] %}<tool_call>{{ call['function']['name'] }} "
    "{{ call['function']['arguments'] }}</tool_call>{% endfor %}<|im_end|>\n{% endgeneration %}"
    "{%- else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


def _tokenizer(texts: list[str]) -> Any:
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is not installed (pip install -e '.[train]')")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=1024, special_tokens=SPECIALS, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(texts, trainer)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tok.chat_template = TEMPLATE
    return tok


def _model(vocab: int) -> Any:
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    return transformers.Qwen2ForCausalLM(config)


# the training stack's own deprecation notices and CPU hints (not this project's code)
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
def test_trl_sft_trainer_fine_tunes_on_the_export_unchanged(
    lake: Any,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch", reason="torch is not installed (pip install -e '.[train]')")
    trl = pytest.importorskip("trl", reason="trl is not installed (pip install -e '.[train]')")
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("WANDB_DISABLED", "true")
    out = tmp_path / "sft"
    export_training_set(Lakehouse.open(lake), "hf", out)
    written = {r["session_id"]: r for r in read_export(out)}
    train = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "cache"))["train"]
    assert len(train) > 0
    texts = [m["content"] or "" for r in written.values() for m in r["messages"]]
    texts += [
        c["function"]["arguments"] for r in written.values() for m in r["messages"] for c in m["tool_calls"] or []
    ]
    tok = _tokenizer(texts)
    # the loaded rows render exactly as the records written: no key merged in from another record
    for row in train:
        raw = written[row["session_id"]]
        assert tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False) == tok.apply_chat_template(
            raw["messages"], tools=raw["tools"], tokenize=False
        )
    model = _model(len(tok))
    config = trl.SFTConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=6,
        per_device_train_batch_size=2,
        learning_rate=3e-3,
        logging_steps=1,
        assistant_only_loss=True,
        max_length=8192,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,  # TRL turns it on by default; a two-layer model only pays its recompute
        use_cpu=True,
        dataloader_num_workers=0,
        seed=7,
    )
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=train, processing_class=tok)
    # a length limit must not silently drop rows or their assistant tokens
    prepared = trainer.train_dataset
    assert len(prepared) == len(train)
    for row in prepared:
        kept = [x != -100 for x in row["labels"]] if "labels" in row else [x == 1 for x in row["assistant_masks"]]
        assert any(kept), "a row lost every assistant token"
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) >= 5 and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]  # it learns
