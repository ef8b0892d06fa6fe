"""Build a tiny chat model for a real inference server: random weights, a tokenizer trained here, a ChatML template.

    python scripts/tiny_model.py OUT_DIR [--corpus DIR]   (run with the vLLM venv's python: scripts/vllm.sh)

No weights are downloaded: a Qwen2 architecture with random weights (2 layers, hidden size 128),
a byte-level BPE tokenizer trained with ``tokenizers`` on local text (this repository's Python
and Markdown files by default), and a chat template of the Qwen2.5 kind: tools in the system turn,
Hermes tool calls re-rendered as ``<tool_call>\\n{…}\\n</tool_call>`` with non-object arguments
as ``{}``, tool results as ``<tool_response>`` blocks in a user turn. The model says nothing
sensible; a test steers it with the server's structured outputs when it needs tool calls.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Jinja (transformers' sandbox), written on one line per piece: no whitespace control is needed or used.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}"
    "\n\n# Tools\n\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "\n</tools>\n\nFor each function call, return a json object within <tool_call></tool_call> tags."
    "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}"
    "{% set function = call.function if call.function is defined else call %}"
    "{% set arguments = function.arguments %}"
    "{% if (loop.first and message.content) or not loop.first %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ function.name }}", "arguments": '
    "{% if arguments is mapping %}{{ arguments | tojson }}{% elif arguments is string and arguments.startswith('{')"
    " %}{{ arguments }}{% else %}{}{% endif %}}\n</tool_call>"
    "{% endfor %}"
    "{% if not (loop.last and continue_final_message is defined and continue_final_message) %}<|im_end|>\n"
    "{% endif %}"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def corpus_lines(root: Path) -> Iterator[str]:
    """Lines of the local text the tokenizer learns from."""
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".md") and ".venv" not in path.parts and path.is_file():
            yield from path.read_text(errors="replace").splitlines()


def build(out: Path, corpus: Path, vocab_size: int = 2048) -> Path:
    """Write the model directory (config, random weights, tokenizer, template); returns ``out``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(ADDED)  # ordinary added tokens: kept in decoded text, like Qwen2.5's <tool_call>
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(fast),
        hidden_size=128,  # head size 64: the smallest vLLM's CPU attention kernels take
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": config.eos_token_id}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    print(build(args.out, args.corpus))


if __name__ == "__main__":
    main()
