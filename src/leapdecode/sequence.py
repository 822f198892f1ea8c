"""The step rule of one request, shared by the single-request loop (`decode`) and the batched `Engine`.

A step: the drafter proposed `draft`; the target scored [last token + draft] in one forward. `accept` turns those
logits into the step's new tokens (greedy: the longest matching draft prefix plus the target's own token; sampling:
speculative sampling), updates the stats, and tells the caller how many drafted positions to forget from the KV cache.
`propose` asks the drafter for the next draft. Whoever runs the forward (a Runner, or the Engine's flat batch) is
the only thing that differs between one request and many, so the losslessness argument is the same for both: each
sequence's rows see exactly its own past.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from .controller import DraftLengthController
from .drafters.base import EMPTY, Draft, Drafter
from .drafters.calibration import cumulative
from .penalties import NO_PENALTIES, Penalties, prompt_mask
from .sampling import SamplingConfig, generator_at, probabilities
from .stats import GenerationStats
from .structured import Grammar
from .verify import greedy_accept, greedy_accept_ids, speculative_accept


@dataclass(frozen=True)
class TokenLogprobs:
    """One output token's log-probability under the target's raw distribution (log_softmax of the logits row that
    decided it, before temperature, filters and masks), the `top` most likely tokens' (most likely first), and its
    `rank` there (1: the most likely; vLLM's, as its prompt_logprobs report it)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


class SequenceState:
    """One request being decoded: its tokens, its drafter and draft-length controller, its stats."""

    def __init__(
        self,
        prompt_ids: list[int],
        drafter: Drafter,
        *,
        sampling: SamplingConfig,
        controller: DraftLengthController,
        max_new_tokens: int,
        eos_ids: set[int],
        context_length: int,
        min_tokens: int = 0,
        stop_token_ids=(),
        ignore_eos: bool = False,
        logprobs: int | None = None,
        penalties: Penalties = NO_PENALTIES,
        grammar: Grammar | None = None,
    ):
        """`eos_ids`: the model's end of sequence; `stop_token_ids` end the output too (kept in it, as EOS is);
        `ignore_eos`: EOS ends nothing; `min_tokens`: no stop token (EOS unless ignored, stop_token_ids) can be
        produced at output positions before it (masked out of the distribution there, greedy or sampled);
        `logprobs`: keep a TokenLogprobs with that many top alternatives for every output token (None: none);
        `penalties`: repetition/frequency/presence penalties and a logit bias, applied to every row by what precedes
        it (penalties.Penalties); `grammar`: every row is masked to the tokens that keep the output and the drafts
        before it inside the grammar (structured.Grammar)."""
        if not sampling.greedy:  # one seed for the whole request, drawn now if none was given
            sampling = dataclasses.replace(sampling, seed=sampling.request_seed())
        self.prompt_ids = list(prompt_ids)
        self.drafter, self.sampling, self.controller = drafter, sampling, controller
        self.max_new_tokens, self.eos_ids, self.context_length = max_new_tokens, eos_ids, context_length
        self.stop_ids = (set() if ignore_eos else set(eos_ids)) | set(stop_token_ids)
        self.min_tokens = min_tokens
        self.penalties = penalties
        self._in_prompt: torch.Tensor | None = None  # penalties.prompt_mask, built at the first step that needs it
        self.grammar = None if grammar is None else grammar.start()
        self.context = list(prompt_ids)
        self.out: list[int] = []
        self.num_logprobs = logprobs
        self.logprobs: list[TokenLogprobs] = []  # aligned with `out` when num_logprobs is not None
        self.draft: Draft = EMPTY
        self.ahead = False  # `draft` came from a drafter that estimates acceptance and waits for the planner's cut
        self.draft_seconds = 0.0
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self.start = time.perf_counter()
        drafter.start(self.prompt_ids, sampling)

    @property
    def finished(self) -> bool:
        return bool(self.stats.stop_reason)

    @property
    def argmax_only(self) -> bool:
        """Whether the next forward's logits are read only through their argmax (greedy, nothing masked), so the
        output head may be argmax-only."""
        masked = self.stop_ids and len(self.out) < self.min_tokens
        plain = self.num_logprobs is None and not self.penalties.active and self.grammar is None
        return self.sampling.greedy and not masked and plain

    @property
    def room(self) -> int:
        """The most draft tokens the next step may verify (past it, output or context would be full): a step emits at
        most one token more than it drafts, so output and context each keep room for that one."""
        return max(0, min(self.max_new_tokens - len(self.out), self.context_length - len(self.context)) - 1)

    def accept(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor | None = None,
        forward_tokens: int = 0,
        forward_seconds: float = 0.0,
        argmax: list[int] | None = None,
    ) -> tuple[list[int], int]:
        """Take the target's logits [len(draft) + 1, V] for [last token + draft]; return (new tokens, number of
        drafted positions to roll back). `hidden`: the final-norm features of those rows (draft heads read them).
        The forward's size and time feed the controller when one sequence owns the whole forward. `argmax`: the
        logits' argmax per row, where the caller took it for many sequences at once (greedy only)."""
        draft = self.draft
        raw = logits
        logits = self._penalised(logits)
        if self.grammar is not None:
            logits = self.grammar.mask(logits, draft.tokens)
        logits = _suppress(logits, self.stop_ids, self.min_tokens - len(self.out))
        if argmax is not None and self.sampling.greedy and logits is raw:  # nothing changed: that argmax holds
            new = greedy_accept_ids(draft.tokens, argmax)
        else:
            new = _verify(draft, logits, self.sampling, len(self.out))
        accepted = len(new) - 1
        self.controller.update(len(draft.tokens), accepted, forward_tokens, forward_seconds, self.draft_seconds)
        new = _truncate(new, self.stop_ids, self.max_new_tokens - len(self.out))
        if self.grammar is not None:
            self.grammar.advance(new)
        if self.num_logprobs is not None:
            self.logprobs += token_logprobs(raw[: len(new)], new, self.num_logprobs)
        self.out += new
        self.context += new
        stats = self.stats
        stats.forward_passes += 1
        stats.drafted_tokens += len(draft.tokens)
        stats.accepted_draft_tokens += min(accepted, len(new))
        stats.accepted_per_step.append(len(new))
        stats.new_tokens = len(self.out)
        if stats.forward_passes == 1:
            stats.time_to_first_token = time.perf_counter() - self.start
        stats.stop_reason = _stop_reason(
            self.out, self.stop_ids, self.eos_ids, self.max_new_tokens, len(self.context), self.context_length
        )
        if not self.finished:
            self.drafter.observe(self.context, len(new))
            if self.drafter.needs_hidden:
                self.drafter.see_hidden(None if hidden is None else hidden[accepted])
        self.drop_draft()
        return new, len(draft.tokens) - accepted

    def _penalised(self, logits: torch.Tensor) -> torch.Tensor:
        """The rows' logits after the penalties (the same tensor where there are none)."""
        if not self.penalties.active:
            return logits
        if self.penalties.needs_prompt and self._in_prompt is None:
            self._in_prompt = prompt_mask(self.prompt_ids, logits.shape[-1]).to(logits.device)
        return self.penalties.apply(logits, self.out, self.draft.tokens, self._in_prompt)

    def drop_draft(self) -> None:
        """Forget the draft: verified, or never to be (a request preempted after its drafter drafted ahead reads its
        context again, and the step that ends that reading verifies nothing)."""
        self.draft, self.ahead = EMPTY, False

    def propose(self, k: int) -> list[int]:
        """Ask the drafter for up to k tokens (capped by `room`); return the rows to feed: [last token + draft].
        After `draft_ahead`, cut that draft to k instead."""
        if self.ahead:
            self.ahead = False
            self.draft = self.draft.cut(k)
            return [self.context[-1]] + self.draft.tokens
        k = min(k, self.room)
        t = time.perf_counter()
        draft = self.drafter.propose(self.context, k) if k > 0 else EMPTY
        return self._take(draft, k, time.perf_counter() - t)

    def propose_alone(self) -> list[int]:
        """The next forward's rows for a request decoded alone: a drafter that estimates acceptance drafts first, up
        to the controller's cap, and the controller then keeps the prefix that pays; others draft the controller's k."""
        controller = self.controller
        if not (self.drafter.estimates_acceptance and controller.adaptive):
            return self.propose(controller.next_k())
        self.drafter.floor = controller.floor()
        self.propose(controller.cap)
        return self.propose(controller.choose(self.chain()))

    def chain(self) -> tuple[float, ...]:
        """For a draft made ahead: the probability that its first j + 1 tokens are all accepted, per j."""
        return cumulative(self.draft.estimates or ())

    def _take(self, draft: Draft, k: int, seconds: float) -> list[int]:
        if self.grammar is not None:  # rows past a token the grammar refuses could only be rejected
            k = min(k, self.grammar.valid_prefix(draft.tokens[:k]))
        self.draft = draft.cut(k)
        self.ahead = self.draft.estimates is not None  # the planner may cut it (draft_ahead, propose_alone)
        self.draft_seconds = seconds
        self.stats.draft_time += seconds
        return [self.context[-1]] + self.draft.tokens

    def end_at_stop_string(self, new: list[int], kept: int) -> list[int]:
        """A stop string was completed by new[kept - 1] (`new`: this step's tokens, already in the output): the output
        ends at that token, as plain decoding cut at the stop string would end. Returns the step's tokens kept."""
        del self.out[len(self.out) - len(new) + kept :]
        del self.logprobs[len(self.out) :]  # aligned with out (empty when the request asked for none)
        self.stats.stop_reason = "stop"
        self.stats.new_tokens = len(self.out)
        return new[:kept]

    def finish(self, reason: str = "") -> GenerationStats:
        """Close the record (`reason` overrides the stop reason, e.g. "cancelled")."""
        if reason:
            self.stats.stop_reason = reason
        self.stats.new_tokens = len(self.out)
        self.stats.total_time = time.perf_counter() - self.start
        self.drafter.report(self.stats, self.context, len(self.prompt_ids))
        return self.stats


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprobs]:
    """Row i of `logits` decided tokens[i]: its logprob and the `top` most likely tokens', from log_softmax in fp32."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    rows = torch.arange(len(tokens), device=logprobs.device)
    chosen_values = logprobs[rows, torch.tensor(tokens, dtype=torch.long, device=logprobs.device)]
    chosen, ranks = chosen_values.tolist(), ((logprobs > chosen_values[:, None]).sum(-1) + 1).tolist()
    if top:
        values, ids = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(tokens)
    return [TokenLogprobs(t, lp, alt, rank) for t, lp, alt, rank in zip(tokens, chosen, tops, ranks)]


def propose_together(seqs: list[SequenceState], ks: list[int]) -> list[list[int]]:
    """`propose` for several sequences (the engine's step): the drafters of one class draft in one call
    (Drafter.propose_many: a draft head steps all its sequences as one batch); each is charged an even share of that
    call's time."""
    ks = [min(k, s.room) for s, k in zip(seqs, ks)]
    rows: list[list[int]] = [[]] * len(seqs)
    classes: dict[type, list[int]] = {}
    for i, s in enumerate(seqs):
        if s.ahead:  # drafted ahead (draft_ahead): only cut
            rows[i] = s.propose(ks[i])
        else:
            classes.setdefault(type(s.drafter), []).append(i)
    for cls, members in classes.items():
        t = time.perf_counter()
        drafts = cls.propose_many(
            [seqs[i].drafter for i in members], [seqs[i].context for i in members], [ks[i] for i in members]
        )
        seconds = (time.perf_counter() - t) / len(members)
        for i, draft in zip(members, drafts):
            rows[i] = seqs[i]._take(draft, ks[i], seconds)
    return rows


def draft_ahead(seqs: list[SequenceState], caps: list[int], floor: float) -> list[tuple[float, ...]]:
    """The engine's step for drafters that estimate acceptance: draft up to each cap now (stopping under `floor`),
    return each draft's chain of acceptance estimates for the planner; `propose_together` then only cuts."""
    for s in seqs:
        s.drafter.floor = floor
    propose_together(seqs, caps)
    return [s.chain() for s in seqs]


def _verify(draft: Draft, logits: torch.Tensor, sampling: SamplingConfig, done: int) -> list[int]:
    """New tokens of this step; `done` tokens were generated before it (row i decides output position done + i)."""
    tokens = torch.tensor(draft.tokens, dtype=torch.long, device=logits.device)
    if sampling.greedy:
        return greedy_accept(tokens, logits)
    target_probs = probabilities(logits, sampling).cpu()
    draft_probs = None if draft.probs is None else _match_vocab(draft.probs.cpu(), target_probs.shape[-1])
    generators = [generator_at(sampling.seed, done + i) for i in range(len(draft.tokens) + 1)]
    return speculative_accept(tokens.cpu(), draft_probs, target_probs, generators)


def _match_vocab(probs: torch.Tensor, vocab: int) -> torch.Tensor:
    """Draft and target may pad their output heads differently; align q to the target's vocabulary size."""
    if probs.shape[-1] == vocab:
        return probs
    if probs.shape[-1] > vocab:
        return probs[:, :vocab]
    return torch.nn.functional.pad(probs, (0, vocab - probs.shape[-1]))


def _suppress(logits: torch.Tensor, stop_ids: set[int], rows: int) -> torch.Tensor:
    """`logits` with the stop tokens masked in its first `rows` rows (output positions before min_tokens): row i
    decides output position done + i whatever was drafted, so plain and speculative decoding mask the same places.
    A row whose only allowed tokens are stop tokens (a grammar that is complete) keeps them: the output ends there."""
    rows = min(rows, logits.shape[0])
    ids = [t for t in stop_ids if t < logits.shape[-1]]
    if rows <= 0 or not ids:
        return logits
    masked = logits.clone()
    masked[:rows, ids] = float("-inf")
    stuck = ~torch.isfinite(masked[:rows]).any(-1)
    if stuck.any():
        masked[:rows][stuck] = logits[:rows][stuck]
    return masked


def _truncate(new: list[int], stop_ids: set[int], room: int) -> list[int]:
    new = new[:room]
    for i, token in enumerate(new):
        if token in stop_ids:
            return new[: i + 1]
    return new


def _stop_reason(
    out: list[int], stop_ids: set[int], eos_ids: set[int], max_new_tokens: int, length: int, context_length: int
) -> str:
    if out and out[-1] in stop_ids:
        return "eos" if out[-1] in eos_ids else "stop"
    if len(out) >= max_new_tokens:
        return "length"
    if length >= context_length:
        return "context"
    return ""
