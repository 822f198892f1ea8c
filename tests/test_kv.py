"""KV presses: budget 1.0 is exact, every press keeps the entries it promises, memory accounting matches tensor
sizes, FastKV's own layer loop agrees with the model, and speculative decoding over a compressed cache emits exactly
the compressed cache's plain greedy output."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, noisy_copy, tiny_model

from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.errors import LeapDecodeError
from leapdecode.kv import KV_PRESSES, kv_bytes, make_press
from leapdecode.kv.quantized import QuantizedPromptLayer
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig

ARCHS = ["llama", "qwen2"]
PROMPT_LEN = 150


@pytest.fixture(scope="module")
def models():
    return {arch: tiny_model(arch, seed=40 + i) for i, arch in enumerate(ARCHS)}


def prompt(seed: int, n: int = PROMPT_LEN) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def run(model, ids, press=None, drafter="none", k=4, max_new=24, **options):
    runner = Runner(model, press=press)
    out, _ = decode(
        runner,
        ids,
        make_drafter(drafter, **options),
        sampling=SamplingConfig(),
        controller=DraftLengthController(k_init=k, k_max=8, adaptive=True),
        max_new_tokens=max_new,
        eos_ids=set(),
        context_length=512,
    )
    return out, runner


def small(name, budget, **options):
    """Presses with windows that fit the tiny models' short prompts."""
    if name in ("snapkv", "fastkv"):
        options.setdefault("window", 8)
    if name == "fastkv":
        options.setdefault("tsp_layer", 0)
    if name == "quantized":
        options.setdefault("group", 16)
    return make_press(name, budget=budget, **options)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", KV_PRESSES)
def test_budget_one_is_exact(models, arch, name):
    model = models[arch]
    ids = prompt(1)
    reference, plain = run(model, ids)
    out, runner = run(model, ids, make_press(name, budget=1.0))
    assert out == reference
    assert runner.cache_length == plain.cache_length
    for a, b in zip(plain.kv_layers(), runner.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", ["streaming-llm", "snapkv", "fastkv"])
@pytest.mark.parametrize("budget", [0.5, 0.2])
def test_keeps_promised_entries_and_bytes(models, arch, name, budget):
    model = models[arch]
    press = small(name, budget)
    runner = Runner(model, press=press)
    runner.prefill(prompt(2))
    keep = press.kept(PROMPT_LEN)
    assert keep == -(-int(budget * 100) * PROMPT_LEN // 100)  # ceil(budget * n)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    for layer in runner.cache.layers:
        assert layer.keys.shape == (1, config.num_key_value_heads, keep, head_dim) == layer.values.shape
    assert runner.cache_length == keep and runner.position == PROMPT_LEN
    assert kv_bytes(runner.cache) == config.num_hidden_layers * 2 * config.num_key_value_heads * keep * head_dim * 4
    runner.forward([3, 4, 5])  # decoded tokens are appended, uncompressed
    assert runner.cache_length == keep + 3


def test_streaming_llm_keeps_sinks_and_recent(models):
    model = models["llama"]
    ids = prompt(3)
    full = Runner(model)
    full.prefill(ids)
    press = make_press("streaming-llm", budget=0.2, sinks=4)
    runner = Runner(model, press=press)
    runner.prefill(ids)
    keep = press.kept(len(ids))
    index = list(range(4)) + list(range(len(ids) - keep + 4, len(ids)))
    for a, b in zip(full.kv_layers(), runner.cache.layers):
        assert torch.equal(b.keys, a.keys[:, :, index])


def test_snapkv_keeps_window_and_selects_per_head(models):
    model = models["qwen2"]
    ids = prompt(4)
    full = Runner(model)
    full.prefill(ids)
    runner = Runner(model, press=make_press("snapkv", budget=0.3, window=8))
    runner.prefill(ids)
    for a, b in zip(full.kv_layers(), runner.cache.layers):
        assert torch.equal(b.keys[:, :, -8:], a.keys[:, :, -8:])  # the observation window is always kept
        for head in range(a.keys.shape[1]):  # every kept entry is an entry of the full cache, in order
            rows = [int((a.keys[0, head] == row).all(-1).nonzero()[0]) for row in b.keys[0, head]]
            assert rows == sorted(rows) and len(set(rows)) == len(rows)


@pytest.mark.parametrize("arch", ARCHS)
def test_fastkv_without_propagation_cut_equals_snapkv(models, arch):
    """FastKV's own layer loop with TSP rate 1 is SnapKV computed layer by layer: same cache, same logits."""
    model = models[arch]
    ids = prompt(5)
    snap = Runner(model, press=make_press("snapkv", budget=0.4, window=8, kernel=5))
    fast = Runner(model, press=make_press("fastkv", budget=0.4, window=8, kernel=5, tsp_rate=1.0, tsp_layer=1))
    assert torch.allclose(snap.prefill(ids), fast.prefill(ids), atol=1e-5)
    for a, b in zip(snap.cache.layers, fast.cache.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


def test_fastkv_propagates_selected_tokens(models):
    model = models["llama"]
    press = make_press("fastkv", budget=0.2, tsp_layer=0, tsp_rate=0.3, window=8)
    assert press.propagated(PROMPT_LEN) == 45 and press.kept(PROMPT_LEN) == 30
    assert make_press("fastkv", budget=0.5, tsp_rate=0.2).propagated(100) == 50  # never fewer than the budget
    runner = Runner(model, press=press)
    logits = runner.prefill(prompt(6))
    assert logits.shape == (VOCAB,) and torch.isfinite(logits).all()
    assert [layer.keys.shape[2] for layer in runner.cache.layers] == [30, 30]


@pytest.mark.parametrize("bits,tolerance", [(8, 0.02), (4, 0.3)])
def test_quantized_accounting_and_error(models, bits, tolerance):
    model = models["llama"]
    ids = prompt(7)
    full = Runner(model)
    full.prefill(ids)
    press = make_press("quantized", budget=0.5, bits=bits, group=16)
    runner = Runner(model, press=press)
    runner.prefill(ids)
    config = model.config
    heads, dim, n = config.num_key_value_heads, config.hidden_size // config.num_attention_heads, len(ids)
    quantized = n // 16 * 16
    expected = (
        heads * quantized * dim * bits // 8
        + 2 * 4 * heads * (quantized // 16) * dim  # key codes, scale+min
        + heads * quantized * dim * bits // 8
        + 2 * 4 * heads * quantized  # value codes, scale+min
        + 2 * heads * (n - quantized) * dim * 4
    )  # fp32 tail
    assert kv_bytes(runner.cache) == config.num_hidden_layers * expected
    assert runner.cache_length == n == press.kept(n)
    for a, b in zip(full.kv_layers(), runner.cache.layers):
        assert isinstance(b, QuantizedPromptLayer)
        keys, values = b.dequantized()
        assert keys.shape == a.keys.shape
        assert (keys - a.keys).abs().max() <= tolerance * a.keys.abs().max()
        assert (values - a.values).abs().max() <= tolerance * a.values.abs().max()
        assert torch.equal(keys[:, :, quantized:], a.keys[:, :, quantized:])  # the tail stays exact
    runner.forward([1, 2, 3])
    runner.rollback(2)
    assert runner.cache_length == n + 1
    with pytest.raises(LeapDecodeError):
        runner.rollback(2 + n - quantized)


def test_quantized_bits_follow_budget(models):
    model = models["llama"]
    assert make_press("quantized", budget=1.0).bits_for(model) is None
    assert make_press("quantized", budget=0.5).bits_for(model) == 8
    assert make_press("quantized", budget=0.25).bits_for(model) == 4
    with pytest.raises(LeapDecodeError, match="cannot reach budget"):
        make_press("quantized", budget=0.05).check(model)


CASES = [("prompt-lookup", {"max_ngram": 2}), ("draft-model", "noisy"), ("draft-model", "independent")]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "name,budget", [("streaming-llm", 0.3), ("snapkv", 0.3), ("fastkv", 0.3), ("quantized", 0.25), ("quantized", 0.5)]
)
def test_drafters_over_compressed_cache_are_lossless(models, arch, name, budget):
    model = models[arch]
    ids = prompt(8, 60) + prompt(9, 12) * 5  # repeats, so that prompt lookup finds drafts
    reference, _ = run(model, ids, small(name, budget), max_new=30)
    drafts = {"noisy": noisy_copy(model, seed=50, noise=0.5), "independent": tiny_model(arch, seed=60)}
    for drafter, options in CASES:
        if drafter == "draft-model":
            options = {"draft_model": drafts[options], "confidence": 0.0}
        for k in (2, 5):
            out, _ = run(model, ids, small(name, budget), drafter=drafter, k=k, max_new=30, **options)
            assert out == reference, f"{name}@{budget} with {drafter} k={k} diverged from its own greedy baseline"


@pytest.mark.parametrize("budget", [0, -0.5, 1.5, float("nan"), "half"])
def test_bad_budget_is_one_line(budget):
    with pytest.raises(LeapDecodeError, match="budget") as info:
        make_press("snapkv", budget=budget)
    assert "\n" not in str(info.value)


def test_bad_press_and_options(models):
    with pytest.raises(LeapDecodeError, match="unknown KV press 'h2o'"):
        make_press("h2o", budget=0.5)
    with pytest.raises(LeapDecodeError, match="no option tsp_layer"):
        make_press("snapkv", budget=0.5, tsp_layer=3)
    with pytest.raises(LeapDecodeError, match="TSP rate"):
        make_press("fastkv", budget=0.5, tsp_rate=0)
    press = make_press("fastkv", budget=0.5, tsp_layer=2)  # the tiny models have layers 0 and 1
    with pytest.raises(LeapDecodeError, match="TSP layer 2 is outside the model's layers"):
        press.check(models["llama"])
    with pytest.raises(LeapDecodeError, match="outside"):
        Runner(models["llama"], press=press).prefill(prompt(10))
    with pytest.raises(LeapDecodeError, match="TSP layer -1"):
        make_press("fastkv", budget=0.5, tsp_layer=-1).check(models["qwen2"])


def test_press_unknown_for_architecture():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    for name in KV_PRESSES:
        with pytest.raises(LeapDecodeError, match="not available for model type 'gpt2'"):
            make_press(name, budget=0.5).check(gpt2)


@pytest.mark.slow
def test_smollm2_needle_with_fastkv():
    """On the real SmolLM2-135M, a 1k-token needle prompt is answered through FastKV at half the KV cache."""
    from leapdecode.api import generate
    from leapdecode.lab.kv.needle import needle_prompt
    from leapdecode.models import load_model

    loaded = load_model("smollm2-135m")
    sample = needle_prompt(loaded.tokenizer, 1024, depth=0.4, seed=3)
    full = generate(loaded, sample.text, raw=True, max_new_tokens=8)
    press = make_press("fastkv", budget=0.5)
    press.check(loaded.model)
    out = generate(loaded, sample.text, raw=True, max_new_tokens=8, kv_press=press)
    assert sample.answer in full.text and sample.answer in out.text


def test_bench_summary_report_and_targets(tmp_path):
    from leapdecode.lab.kv.bench import check_targets, parse_press, summarize
    from leapdecode.lab.kv.report import write
    from leapdecode.lab.report_kit import environment as machine

    assert parse_press("fastkv:tsp_layer=9:tsp_rate=0.1") == (
        "fastkv:tsp_layer=9:tsp_rate=0.1",
        "fastkv",
        {"tsp_layer": 9, "tsp_rate": 0.1},
    )
    records = []
    for sample, kind in enumerate(["needle", "needle", "document"]):
        common = {"length": 4096, "sample": sample, "kind": kind, "depth": 0.5, "tokens": 4090, "full_kv_bytes": 1000}
        quality = (
            {"correct": True, "decode_s": 1.0, "decode_cpu_s": 2.0, "decode_tokens": 7}
            if kind == "needle"
            else {"agreement": 1.0, "identical_prefix": 1.0}
        )
        records.append(
            {
                **common,
                "press": "full",
                "budget": 1.0,
                "prefill_s": 10.0,
                "prefill_cpu_s": 20.0,
                "kv_bytes": 1000,
                **quality,
            }
        )
        quality = (
            {"correct": sample == 0, "decode_s": 0.5, "decode_cpu_s": 1.6, "decode_tokens": 7}
            if kind == "needle"
            else {"agreement": 0.75, "identical_prefix": 0.5}
        )
        records.append(
            {
                **common,
                "press": "fastkv",
                "budget": 0.25,
                "prefill_s": 5.0,
                "prefill_cpu_s": 16.0,
                "kv_bytes": 250,
                **quality,
            }
        )
    summary = summarize(records)
    fast = next(s for s in summary if s["press"] == "fastkv")
    assert fast["prefill_speedup"] == 2.0 and fast["decode_speedup"] == 2.0 and fast["kv_fraction"] == 0.25
    assert fast["prefill_cpu_speedup"] == 1.25 and fast["decode_cpu_speedup"] == 1.25
    assert fast["needle_accuracy"] == 0.5 and fast["agreement"] == 0.75 and fast["decode_tok_s"] == 14.0
    assert check_targets(summary) == [
        {"press": "fastkv", "budget": 0.25, "prefill": True, "prefill_cpu": False, "memory": True, "accuracy": False}
    ]
    result = {
        "settings": {
            "budgets": [0.25],
            "needles": 2,
            "documents": 1,
            "answer_tokens": 8,
            "continuation": 32,
            "dtype": "float32",
        },
        "machine": machine(),
        "model": "tiny",
        "records": records,
        "summary": summary,
    }
    paths = write(result, tmp_path)
    assert [p.name for p in paths] == ["results.json", "report.md", "kv_4096.png"]
    assert "| fastkv | 0.25 |" in (tmp_path / "report.md").read_text()


def test_bench_cli_rejects_unknown_press(capsys):
    from leapdecode.cli import main

    assert main(["bench-kv", "--presses", "snapkv,h2o", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip()
        == "leapdecode: error: unknown KV press 'h2o'; choose from: streaming-llm, snapkv, quantized, fastkv"
    )


def test_needle_prompt_hides_the_fact_at_its_depth():
    from leapdecode.lab.kv.needle import depths, needle_prompt

    class Words:  # a word-level stand-in for a tokenizer
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": text.split()}

    sample = needle_prompt(Words(), 400, depth=0.25, seed=1)
    assert 380 <= sample.tokens <= 400 and sample.answer.isdigit() and len(sample.answer) == 5
    position = sample.text.index(f"is {sample.answer}.") / len(sample.text)
    assert 0.15 < position < 0.35 and sample.text.endswith("is")
    assert depths(4) == [0.125, 0.375, 0.625, 0.875]


def forced_needle_model(needle: int):
    """A tiny Llama whose layer-0 attention is forced: every query looks at the keys of token `needle` and at
    nothing else. Queries and keys use only the lowest-frequency RoPE pair (dims 7 and 15 of each 16-dim head, a
    rotation under 0.05 rad across the prompt), so the match does not depend on distance: q7 reads hidden dim 1
    (constant for every token), k7 reads hidden dim 0 (non-zero only for the needle)."""
    model = tiny_model("llama", seed=45)
    attn, head_dim = model.model.layers[0].self_attn, 16
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed[:, 0], embed[:, 1] = 0.0, 1.0
        embed[needle, 0] = 3.0
        attn.q_proj.weight.zero_()
        attn.k_proj.weight.zero_()
        attn.q_proj.weight[7::head_dim, 1] = 1.0
        attn.k_proj.weight[7::head_dim, 0] = 1.0
    return model


def propagated_positions(model, ids, press) -> list[int]:
    """Positions that reach the layer after the TSP layer (layer 1), read from that layer's inputs (on HF's layers:
    the fused ones compute the same, see test_fastkv_on_the_fused_layers_computes_what_hf_layers_compute)."""
    seen = []
    hook = model.model.layers[1].register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"][0].tolist()), with_kwargs=True
    )
    try:
        Runner(model, press=press, packed_weights=False).prefill(ids)
    finally:
        hook.remove()
    return seen[0]


def test_fastkv_propagates_the_tokens_the_window_attends_to(monkeypatch):
    """Three needles in 150 random tokens, attention forced onto them: TSP with room for 3 + the window must
    propagate exactly the needles and the window; a random token choice is caught by the same check."""
    import leapdecode.kv.fastkv as fastkv

    needle, needles, n = VOCAB - 1, [17, 64, 120], PROMPT_LEN
    ids = [t % (VOCAB - 1) for t in prompt(9)]
    for position in needles:
        ids[position] = needle
    model = forced_needle_model(needle)
    rate = 11 / n  # the window (8) + 3 tokens
    press = make_press("fastkv", budget=rate, tsp_layer=0, tsp_rate=rate, window=8, kernel=1)
    expected = needles + list(range(n - 8, n))
    assert propagated_positions(model, ids, press) == expected

    real = fastkv.select_top

    def random_tsp(scores, keep, window):  # negative control: TSP keeps random tokens
        return (
            real(torch.rand(scores.shape, generator=torch.Generator().manual_seed(0)), keep, window)
            if scores.dim() == 1
            else real(scores, keep, window)
        )

    monkeypatch.setattr(fastkv, "select_top", random_tsp)
    assert propagated_positions(model, ids, press) != expected


@pytest.mark.parametrize("arch", ARCHS)
def test_fastkv_on_the_fused_layers_computes_what_hf_layers_compute(models, arch, monkeypatch):
    """With leapdecode's kernels FastKV runs the fused decoder's layers (the Runner's own forward) over the same cache:
    the same selection, cache and logits as over HF's layers, up to the rounding of fused products."""
    from leapdecode.kernels.fused_decoder import FusedDecoder

    model, ids = models[arch], prompt(10)
    calls = []
    layer = FusedDecoder.layer
    monkeypatch.setattr(FusedDecoder, "layer", lambda self, i, *a: calls.append(i) or layer(self, i, *a))
    options = dict(budget=0.3, window=8, tsp_layer=0, tsp_rate=0.4)
    fused = Runner(model, press=make_press("fastkv", **options))
    hf = Runner(model, press=make_press("fastkv", **options), packed_weights=False)
    torch.testing.assert_close(fused.prefill(ids), hf.prefill(ids), rtol=1e-4, atol=1e-4)
    assert calls == list(range(model.config.num_hidden_layers))  # every layer ran fused
    for a, b in zip(fused.cache.layers, hf.cache.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-4)
