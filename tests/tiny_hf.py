"""Tiny local HF model directories (random weights + a word-level or byte-level BPE tokenizer with a chat template),
built offline."""

from __future__ import annotations

from pathlib import Path

from conftest import tiny_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
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
    return _save(path, tokenizer, context, seed, eos=1)


def _save(path: Path, tokenizer, context: int, seed: int, eos: int) -> Path:
    """A random tiny Llama over the tokenizer's vocabulary, with the chat template, saved beside it."""
    tokenizer.chat_template = CHAT_TEMPLATE
    model = tiny_model("llama", seed=seed, vocab=len(tokenizer))
    model.config.max_position_embeddings = context
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


BPE_TEXT = [
    '{"name": "Ana", "age": 31, "city": "Lima"}',
    '{"items": [1, 2, 3], "ok": true, "note": null}',
    "2024-01-31 is a date; 1999-12-01 is another one.",
    "yes no maybe yes no the cat sat on the mat",
    "def add(a, b): return a + b",
]


def make_tiny_bpe_dir(path: Path, context: int = 256, seed: int = 0) -> Path:
    """A byte-level BPE tokenizer (as GPT-2's, Llama 3's, Qwen's: every byte has a token) trained on a few lines
    of JSON, dates and words, and a random model over its vocabulary; token 0 is the end of sequence."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(BPE_TEXT * 4, trainer)
    return _save(path, PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>"), context, seed, eos=0)
