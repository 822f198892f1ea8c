"""A tiny local HF model directory (random weights + a word-level tokenizer with a chat template), built offline."""

from __future__ import annotations

from pathlib import Path

from conftest import tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

WORDS = ["<unk>", "<eos>", "<user>", "<assistant>"] + [f"w{i}" for i in range(60)] + ["hello", "world", "the", "a"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<' + m['role'] + '> ' + m['content'] + ' ' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<assistant> ' }}{% endif %}"
)


def make_tiny_hf_dir(path: Path, words=WORDS, context: int = 64, seed: int = 0) -> Path:
    vocab = {w: i for i, w in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    model = tiny_model("llama", seed=seed, vocab=len(words))
    model.config.max_position_embeddings = context
    model.config.eos_token_id = 1
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
