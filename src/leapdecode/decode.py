"""The single-request decode loop. Plain decoding is this loop with the `none` drafter.

Each step: the drafter proposes up to k tokens, the target scores [last token + draft] in one forward pass, the
sequence keeps the accepted prefix plus one target token (`SequenceState.accept`, the step rule the batched Engine
shares), the runner forgets the rejected positions, and the controller picks the next k.
"""

from __future__ import annotations

import time
from typing import Callable

from .controller import DraftLengthController
from .drafters.base import Drafter
from .runner import Runner
from .sampling import SamplingConfig
from .sequence import SequenceState
from .stats import GenerationStats
from .text import TextStream


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
    logprobs_sink: list | None = None,
    text: TextStream | None = None,
    **state_options,
) -> tuple[list[int], GenerationStats]:
    """Generate up to max_new_tokens after prompt_ids; stop at EOS (kept) exactly where plain decoding would.
    With `logprobs` among the state options, `logprobs_sink` receives one TokenLogprobs per output token. `text`: the
    output's incremental text with the request's stop strings; the output ends at the token that completes one, as in
    the Engine (engine.output)."""
    seq = SequenceState(
        prompt_ids,
        drafter,
        sampling=sampling,
        controller=controller,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids,
        context_length=context_length,
        **state_options,  # stops, penalties, logprobs (params.RequestParams.state_options)
    )
    runner.keep_hidden = drafter.needs_hidden
    runner.argmax_only = seq.argmax_only
    logits = runner.prefill(prompt_ids)[None]
    seq.stats.cached_prompt_tokens = runner.reused
    fed, forward_seconds = 0, 0.0  # the prefill is not a decode step: nothing to time
    while True:
        new, rejected = seq.accept(logits, runner.hidden, fed, forward_seconds)
        runner.rollback(rejected)
        if text is not None:
            kept = text.push(new)
            if text.stopped:
                new = seq.end_at_stop_string(new, kept)
        if on_tokens is not None:
            on_tokens(new)
        if seq.finished:
            break
        rows = seq.propose_alone()
        runner.argmax_only = seq.argmax_only
        t = time.perf_counter()
        logits = runner.forward(rows)
        fed, forward_seconds = len(rows), time.perf_counter() - t
    runner.remember(seq.context)
    if logprobs_sink is not None:
        logprobs_sink += seq.logprobs
    return seq.out, seq.finish()
