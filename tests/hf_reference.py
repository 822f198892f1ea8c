"""References that share no leapdecode code: HF `generate` greedy with extra logits processors, and for structured
output a processor that runs its own llguidance matcher over the tokens HF generated and masks what the grammar
refuses."""

from __future__ import annotations

import llguidance
import llguidance.hf
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from leapdecode.structured import StructuredOutput


class GrammarMask(LogitsProcessor):
    """The grammar's mask for HF `generate`: its own llguidance matcher fed the tokens HF generated."""

    def __init__(self, target, structured: dict, prompt_length: int):
        spec = StructuredOutput.of(structured)
        vocab = target.model.config.vocab_size
        tokenizer = llguidance.hf.from_tokenizer(
            target.tokenizer, n_vocab=vocab, eos_token=sorted(target.eos_token_ids)
        )
        self.matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from(spec.kind, spec.spec))
        self.vocab, self.prompt_length, self.fed = vocab, prompt_length, 0

    def __call__(self, input_ids, scores):
        out = input_ids[0, self.prompt_length :].tolist()
        for token in out[self.fed :]:
            assert self.matcher.consume_token(token)
        self.fed = len(out)
        mask = self.matcher.compute_bitmask()  # bit t % 8 of byte t // 8: token t is allowed
        refused = [t for t in range(self.vocab) if not (mask[t // 8] >> (t % 8)) & 1]
        scores[:, refused] = float("-inf")
        return scores


def hf_greedy_with(target, prompt_ids: list[int], n: int, processors=(), **options) -> list[int]:
    """HF greedy with `processors` (and generate's own `options`), cut after the first end of sequence."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = target.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=sorted(target.eos_token_ids),
            logits_processor=LogitsProcessorList(processors),
            **options,
        )
    tokens = out[0, len(prompt_ids) :].tolist()
    end = next((i for i, t in enumerate(tokens) if t in target.eos_token_ids), len(tokens) - 1)
    return tokens[: end + 1]


def hf_greedy(target, prompt_ids: list[int], n: int, structured: dict | None) -> list[int]:
    """HF greedy under the grammar (none: plain)."""
    processors = [GrammarMask(target, structured, len(prompt_ids))] if structured else []
    return hf_greedy_with(target, prompt_ids, n, processors)
