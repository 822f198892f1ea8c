"""One function per method kind. Every method decodes greedily from the same prompt ids with the same eos ids and
max_new_tokens; each returns a `Measurement` (new token ids, wall time, time to first token, target forwards).

HF methods call `model.generate`; leapdecode methods call the public `leapdecode.generate`, as a user would;
`bare-forward` is the floor for plain decoding: the Runner's forward and an argmax per token, nothing else.
Peers (`openvino`, `openvino-prompt-lookup`, optional) run OpenVINO GenAI in a process of their own (see peers.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ...api import generate
from ...drafters import OracleDrafter
from ...errors import LeapDecodeError, require
from ...kv.prefix_cache import GENERATE_TOKENS, PrefixCache
from ...runner import Runner
from .peer_worker import peak_rss_mb  # the one definition (the worker itself imports no leapdecode)
from .peers import PEER_METHODS, check_available

HF_METHODS = ("hf-generate", "hf-assisted", "hf-prompt-lookup")
LEAP_METHODS = ("none", "prompt-lookup", "ngram", "draft-model", "head", "select", "oracle")
FLOOR_METHOD = "bare-forward"
METHODS = HF_METHODS + LEAP_METHODS + (FLOOR_METHOD,)  # ours and HF's; the optional peers are PEER_METHODS
ALL_METHODS = METHODS + PEER_METHODS
NEEDS_DRAFT_MODEL = ("hf-assisted", "draft-model")
SWEEPABLE = ("prompt-lookup", "ngram", "draft-model", "oracle")  # leapdecode drafters with a draft length k


@dataclass(frozen=True)
class Variant:
    """A method at one setting: `draft_length` None means the method's own default (adaptive k for leapdecode)."""

    method: str
    draft_length: int | None = None

    @property
    def label(self) -> str:
        return self.method if self.draft_length is None else f"{self.method}@{self.draft_length}"


@dataclass
class Measurement:
    token_ids: list[int]
    wall_time: float  # seconds around the call, prompt ids in, token ids out
    time_to_first_token: float  # seconds from the call to the first new token
    forward_passes: int  # target forwards, prefill included
    engine: dict = field(default_factory=dict)  # leapdecode's own GenerationStats (leapdecode methods only)
    peak_rss_mb: float | None = None  # peak RSS of the process that ran it (the bench's own, or a peer's worker)


@dataclass
class BenchContext:
    """What every method needs: the loaded target (+ draft) and the common decoding settings."""

    target: "LoadedModel"  # noqa: F821
    draft: "LoadedModel | None" = None  # noqa: F821
    max_new_tokens: int = 128
    draft_length: int = 4
    max_draft_length: int = 16
    hf_prompt_lookup_tokens: int = 10
    packed_weights: bool = True
    head: str | None = None  # draft head directory for method 'head' (default: the target's shipped head)
    peers: "Peers | None" = None  # noqa: F821 - started peer workers (peers.Peers), for the peer methods

    @property
    def eos_ids(self) -> list[int]:
        return list(self.target.eos_token_ids)


def parse_methods(text: str, has_draft: bool) -> list[str]:
    """Comma-separated method names, validated; the error names the unknown one or the missing draft model."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    require(names, "--methods is empty")
    for m in names:
        require(m in ALL_METHODS, f"unknown method '{m}': choose from {', '.join(ALL_METHODS)}")
        require(has_draft or m not in NEEDS_DRAFT_MODEL, f"method '{m}' needs a draft model: add --draft-model NAME")
    require(len(set(names)) == len(names), "--methods lists a method twice")
    if any(m in PEER_METHODS for m in names):
        check_available()  # one line naming the extra to install, before any model is loaded
    return names


def truncate_at_eos(tokens: list[int], eos_ids) -> list[int]:
    """Tokens up to and including the first eos (plain greedy stops there)."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


class _FirstTokenTimer:
    """An HF streamer that notes when the first new token arrives (the first `put` carries the prompt)."""

    def __init__(self, start: float):
        self.start, self.puts, self.first = start, 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter() - self.start

    def end(self) -> None:
        pass


def run_hf(ctx: BenchContext, variant: Variant, prompt_ids: list[int]) -> Measurement:
    """HF `generate`, plain or with its assisted / prompt-lookup candidate generators, greedy."""
    model = ctx.target.model
    extra: dict = {}
    if variant.method == "hf-assisted":
        require(ctx.draft is not None, "method 'hf-assisted' needs a draft model: add --draft-model NAME")
        extra["assistant_model"] = ctx.draft.model
    elif variant.method == "hf-prompt-lookup":
        extra["prompt_lookup_num_tokens"] = variant.draft_length or ctx.hf_prompt_lookup_tokens
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    pad = model.generation_config.pad_token_id
    try:
        start = time.perf_counter()
        timer = _FirstTokenTimer(start)
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=ctx.max_new_tokens,
            do_sample=False,
            num_beams=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=ctx.eos_ids,
            pad_token_id=ctx.eos_ids[0] if pad is None else pad,
            streamer=timer,
            **extra,
        )
        wall = time.perf_counter() - start
    finally:
        hook.remove()
    tokens = truncate_at_eos(out[0, len(prompt_ids) :].tolist(), set(ctx.eos_ids))
    return Measurement(tokens, wall, timer.first if timer.first is not None else wall, calls[0])


def run_leap(
    ctx: BenchContext, variant: Variant, messages: list[dict], reference: list[int] | None, store_key: str
) -> Measurement:
    """`leapdecode.generate` with the variant's drafter; a fixed draft length turns the adaptive controller off."""
    drafter: object = variant.method
    if variant.method == "oracle":
        require(reference is not None, "the oracle needs the reference greedy continuation")
        drafter = OracleDrafter(reference)
    if variant.method == "draft-model":
        require(ctx.draft is not None, "method 'draft-model' needs a draft model: add --draft-model NAME")
    fixed = variant.draft_length is not None
    k = variant.draft_length or ctx.draft_length
    first: list[float] = []
    start = time.perf_counter()
    result = generate(
        ctx.target,
        messages,
        drafter=drafter,
        draft_model=ctx.draft if variant.method == "draft-model" else None,
        max_new_tokens=ctx.max_new_tokens,
        temperature=0.0,
        draft_length=k,
        max_draft_length=k if fixed else max(k, ctx.max_draft_length),
        adaptive_draft_length=not fixed,
        drafter_options=_drafter_options(ctx, variant.method, store_key),
        packed_weights=ctx.packed_weights,
        stream=lambda new: first or first.append(time.perf_counter() - start),
        prefix_cache=_prefix_cache(store_key, messages),
    )
    wall = time.perf_counter() - start
    return Measurement(
        list(result.token_ids),
        wall,
        first[0] if first else wall,
        result.stats.forward_passes,
        engine=result.stats.as_dict(),
    )


_prefix_caches: dict[str, PrefixCache] = {}


def _prefix_cache(store_key: str, messages: list[dict]) -> PrefixCache:
    """Each method and repeat has a prefix cache of its own, as a user's one conversation would: a question's later
    turns reuse its earlier turns' keys/values (OpenVINO GenAI's pipelines do the same), never another method's nor
    another question's. A first turn starts a fresh one, so the bench holds one conversation's keys/values per
    method, not a suite's."""
    if len(messages) == 1 or store_key not in _prefix_caches:
        _prefix_caches[store_key] = PrefixCache(GENERATE_TOKENS)
    return _prefix_caches[store_key]


def _drafter_options(ctx: BenchContext, method: str, store_key: str) -> dict | None:
    options = {}
    if method in ("ngram", "select"):
        options["store_key"] = store_key
    if method in ("head", "select") and ctx.head:
        options["head"] = ctx.head
    return options or None


def run_bare_forward(ctx: BenchContext, prompt_ids: list[int]) -> Measurement:
    """Greedy decoding as a bare loop over the Runner: prefill, then one single-token forward (warm KV cache) and an
    argmax per token, with no templating, drafting, verification, control or streaming: what `none` costs at best."""
    runner = Runner(ctx.target.model, packed_weights=ctx.packed_weights)
    runner.argmax_only = True
    eos = set(ctx.eos_ids)
    start = time.perf_counter()
    tokens = [int(runner.prefill(prompt_ids).argmax())]
    first = time.perf_counter() - start
    while len(tokens) < ctx.max_new_tokens and tokens[-1] not in eos:
        tokens.append(int(runner.forward([tokens[-1]], last_only=True)[-1].argmax()))
    return Measurement(tokens, time.perf_counter() - start, first, len(tokens))


def run_peer(ctx: BenchContext, variant: Variant, prompt_ids: list[int], messages: list[dict]) -> Measurement:
    """A peer (OpenVINO GenAI) on our prompt token ids; its worker also checks that its own tokenizer reads the
    templated prompt as the same ids. Wall time and TTFT are measured in the worker around its generate call."""
    require(ctx.peers is not None, f"method '{variant.method}' needs its peer started (run_benchmark does it)")
    tok = ctx.target.tokenizer
    text = (
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if getattr(tok, "chat_template", None)
        else None
    )
    answer = ctx.peers.generate(variant.method, prompt_ids, text, ctx.max_new_tokens, ctx.eos_ids)
    tokens = truncate_at_eos(answer["tokens"], set(ctx.eos_ids))
    return Measurement(tokens, answer["wall"], answer["ttft"], 0, peak_rss_mb=answer["peak_rss_mb"])


def run_variant(
    ctx: BenchContext,
    variant: Variant,
    prompt_ids: list[int],
    messages: list[dict],
    reference: list[int] | None,
    store_key: str = "bench",
) -> Measurement:
    if variant.method in PEER_METHODS:
        return run_peer(ctx, variant, prompt_ids, messages)
    if variant.method in HF_METHODS:
        m = run_hf(ctx, variant, prompt_ids)
    elif variant.method in LEAP_METHODS:
        m = run_leap(ctx, variant, messages, reference, store_key)
    elif variant.method == FLOOR_METHOD:
        m = run_bare_forward(ctx, prompt_ids)
    else:
        raise LeapDecodeError(f"unknown method '{variant.method}': choose from {', '.join(ALL_METHODS)}")
    m.peak_rss_mb = peak_rss_mb()
    return m


def first_difference(reference: list[int], tokens: list[int]) -> int | None:
    """Index of the first differing token (a length difference counts), or None when identical."""
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


@torch.inference_mode()
def divergence(ctx: BenchContext, prompt_ids: list[int], reference: list[int], tokens: list[int]) -> dict:
    """Where `tokens` leaves the greedy `reference`, with the target's top-2 logit margin there (one plain forward
    over prompt + the common prefix): a margin near 0 is a numerical tie, a large one a bug."""
    pos = first_difference(reference, tokens)
    if pos is None:
        return {}
    ids = torch.tensor([prompt_ids + reference[:pos]], dtype=torch.long)
    raw = ctx.target.model(input_ids=ids, logits_to_keep=1).logits[0, -1]
    logits = raw.float()
    top = torch.topk(logits, 2)
    info = {
        "position": pos,
        "top1": int(top.indices[0]),
        "top2": int(top.indices[1]),
        "top2_margin": round(float(top.values[0] - top.values[1]), 6),
        "tie_margin": round(tie_margin(float(top.values[0]), raw.dtype), 6),
        "reference_token": reference[pos] if pos < len(reference) else None,
        "method_token": tokens[pos] if pos < len(tokens) else None,
    }
    if info["reference_token"] is not None and info["method_token"] is not None:
        info["logit_gap"] = round(float(logits[info["reference_token"]] - logits[info["method_token"]]), 6)
    return info


def tie_margin(top_logit: float, dtype: torch.dtype) -> float:
    """The top-2 margin under which two logits count as tied: a k-token forward and k one-token forwards round
    differently, by up to a few units in the last place of the logit in the model's dtype (bf16 logits near 20 are
    0.125 apart), and never less than 0.01 (fp32 kernels accumulate in different orders)."""
    return max(0.01, 4 * torch.finfo(dtype).eps * abs(top_logit))
