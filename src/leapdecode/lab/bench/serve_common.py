"""What bench-serve's scenarios share: concurrency levels, the prompts, percentiles, one streamed request."""

from __future__ import annotations

from ...errors import LeapDecodeError, require
from .sampling_args import sampling_options


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise LeapDecodeError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    require(levels and all(c >= 1 for c in levels), f"--concurrency levels must be >= 1, got {text!r}")
    return levels


def load_prompts(suite: str) -> list[str]:
    from .suites import load_suite

    return [q.turns[0] for q in load_suite(suite)]


def level_prompts(
    prompts: list[str], count: int, concurrency: int, round_: int = 1, distinct: bool = True
) -> list[str]:
    """The `count` prompts of one level: the suite's in order, cycling. `distinct`: each begins with a tag naming its
    level, round and place (`[c4 r2 #7] ...`), so that no request repeats text a server has already seen and no level
    is served from the prompt caches an earlier one filled (real traffic seldom sends one question twice; a server
    with prefix caching would otherwise skip most prefill from the second level on, and one without would not). The
    tags are the same for every server measured."""
    chosen = [prompts[i % len(prompts)] for i in range(count)]
    return [f"[c{concurrency} r{round_} #{i}] {p}" for i, p in enumerate(chosen)] if distinct else chosen


def _pct(values: list[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between ranks (numpy's default, as `vllm bench serve`)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q / 100 * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def streamed_call(client, model: str, prompt: str, args):
    """The streaming call of `args.endpoint` for one prompt (a coroutine), and a function from one streamed event to
    (its text, the answer's output tokens where the event reports them, else None)."""
    json_object = getattr(args, "json_object", False)
    if args.endpoint == "responses":
        shape = {"text": {"format": {"type": "json_object"}}} if json_object else {}
        call = client.responses.create(
            model=model, input=prompt, max_output_tokens=args.max_tokens, stream=True, **sampling_options(args), **shape
        )

        def read(event):
            if event.type == "response.output_text.delta":
                return event.delta, None
            usage = event.response.usage if event.type == "response.completed" else None
            return "", usage.output_tokens if usage else None

        return call, read
    common = dict(
        model=model,
        max_tokens=args.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        **sampling_options(args),
    )
    if json_object:
        common["extra_body"] = {"response_format": {"type": "json_object"}}
    chat = args.endpoint == "chat"
    if chat:
        call = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
    else:
        call = client.completions.create(prompt=prompt, **common)

    def read(chunk):
        usage = getattr(chunk, "usage", None)
        tokens = usage.completion_tokens if usage else None
        if not chunk.choices:
            return "", tokens
        return (chunk.choices[0].delta.content if chat else chunk.choices[0].text) or "", tokens

    return call, read


STEP_COUNTERS = {  # engine.counters key -> the Prometheus counter a leapdecode server exposes it as
    "steps": "leapdecode:engine_steps",
    "step_seconds": "leapdecode:engine_step_seconds",
    "forward_seconds": "leapdecode:engine_forward_seconds",
    "handover_seconds": "leapdecode:engine_handover_seconds",  # a server's alone (none in process)
}


def scrape_step_counters(url: str) -> dict | None:
    """A leapdecode server's step counters from its /metrics (keys of STEP_COUNTERS), or None for a server that has
    none (a peer) or no /metrics to read."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url.rstrip("/") + "/metrics", timeout=10).raise_for_status().text
    except httpx.HTTPError:
        return None
    names = {name: key for key, name in STEP_COUNTERS.items()}
    found = {
        names[f.name]: sum(s.value for s in f.samples if s.name.endswith("_total"))
        for f in text_string_to_metric_families(text)
        if f.name in names
    }
    return found if {"steps", "step_seconds", "forward_seconds"} <= set(found) else None


def step_columns(before: dict | None, after: dict | None) -> dict:
    """The engine's mean step over a level, its forward alone, and a server's wait after it for the event loop to
    write the step's outputs, in ms (from step counters read before and after the level): what serving adds shows in
    the rest and the hand-over, and as a dearer forward where other work shares the cores."""
    if not before or not after or after["steps"] <= before["steps"]:
        return {}
    steps = after["steps"] - before["steps"]
    ms = {k: round(1000 * (after[k] - before[k]) / steps, 2) for k in STEP_COUNTERS if k in before and k in after}
    columns = {"engine_steps": int(steps), "step_ms": ms["step_seconds"], "forward_ms": ms["forward_seconds"]}
    return columns | ({"handover_ms": ms["handover_seconds"]} if "handover_seconds" in ms else {})
