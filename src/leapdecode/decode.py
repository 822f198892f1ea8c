"""The one decode loop. Plain decoding is this loop with the `none` drafter.

Each step: the drafter proposes up to k tokens, the target scores [last token + draft] in one forward pass, the
verifier keeps the accepted prefix plus one target token, the runner forgets the rejected positions, the drafter
observes the new tokens, and the controller picks the next k.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from .controller import DraftLengthController
from .drafters.base import Draft, Drafter
from .runner import Runner
from .sampling import SamplingConfig, generator_at, probabilities
from .stats import GenerationStats
from .verify import greedy_accept, speculative_accept


def decode(
    runner: Runner,
    prompt_ids: list[int],
    drafter: Drafter,
    *,
    sampling: SamplingConfig,
    controller: DraftLengthController,
    max_new_tokens: int,
    eos_ids: set[int],
    context_length: int,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> tuple[list[int], GenerationStats]:
    """Generate up to max_new_tokens after prompt_ids; stop at EOS (kept) exactly where plain decoding would."""
    stats = GenerationStats(prompt_tokens=len(prompt_ids))
    if not sampling.greedy:  # one seed for the whole request, drawn now if none was given
        sampling = dataclasses.replace(sampling, seed=sampling.request_seed())
    start = time.perf_counter()
    runner.keep_hidden = drafter.needs_hidden
    runner.argmax_only = sampling.greedy
    drafter.start(prompt_ids, sampling)
    first_logits = runner.prefill(prompt_ids)
    context = list(prompt_ids)
    out: list[int] = []
    draft = Draft([])
    logits = first_logits[None]
    fed, forward_seconds, draft_seconds = 0, 0.0, 0.0  # the prefill is not a decode step: nothing to time
    while True:
        new = _verify(draft, logits, sampling, len(out))
        accepted = len(new) - 1
        runner.rollback(len(draft.tokens) - accepted)
        controller.update(len(draft.tokens), accepted, fed, forward_seconds, draft_seconds)
        new = _truncate(new, eos_ids, max_new_tokens - len(out))
        out += new
        context += new
        stats.forward_passes += 1
        stats.drafted_tokens += len(draft.tokens)
        stats.accepted_draft_tokens += min(accepted, len(new))
        stats.accepted_per_step.append(len(new))
        if stats.forward_passes == 1:
            stats.time_to_first_token = time.perf_counter() - start
        if on_tokens is not None:
            on_tokens(new)
        stats.stop_reason = _stop_reason(out, eos_ids, max_new_tokens, len(context), context_length)
        if stats.stop_reason:
            break
        drafter.observe(context, len(new))
        if drafter.needs_hidden:
            drafter.see_hidden(None if runner.hidden is None else runner.hidden[accepted])
        k = min(controller.next_k(), max_new_tokens - len(out) - 1, context_length - len(context))
        t = time.perf_counter()
        draft = drafter.propose(context, k) if k > 0 else Draft([])
        draft = Draft(draft.tokens[:k], None if draft.probs is None else draft.probs[:k])
        draft_seconds = time.perf_counter() - t
        logits = runner.forward([context[-1]] + draft.tokens)
        fed, forward_seconds = len(draft.tokens) + 1, time.perf_counter() - t - draft_seconds
        stats.draft_time += draft_seconds
    stats.new_tokens = len(out)
    stats.total_time = time.perf_counter() - start
    return out, stats


def _verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, done: int) -> list[int]:
    """New tokens of this step; `done` tokens were generated before it (row i decides output position done + i)."""
    tokens = torch.tensor(draft.tokens, dtype=torch.long)
    if sampling.greedy:
        return greedy_accept(tokens, logits)
    target_probs = probabilities(logits, sampling)
    draft_probs = None if draft.probs is None else _match_vocab(draft.probs, target_probs.shape[-1])
    generators = [generator_at(sampling.seed, done + i) for i in range(len(draft.tokens) + 1)]
    return speculative_accept(tokens, draft_probs, target_probs, generators)


def _match_vocab(probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft and target may pad their output heads differently; align q to the target's vocabulary size."""
    if probs.shape[-1] == vocab:
        return probs
    if probs.shape[-1] > vocab:
        return probs[:, :vocab]
    return torch.nn.functional.pad(probs, (0, vocab - probs.shape[-1]))


def _truncate(new: list[int], eos_ids: set[int], room: int) -> list[int]:
    new = new[:room]
    for i, token in enumerate(new):
        if token in eos_ids:
            return new[: i + 1]
    return new


def _stop_reason(out: list[int], eos_ids: set[int], max_new_tokens: int, length: int, context_length: int) -> str:
    if out and out[-1] in eos_ids:
        return "eos"
    if len(out) >= max_new_tokens:
        return "length"
    if length >= context_length:
        return "context"
    return ""
