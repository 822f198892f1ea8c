"""The benchmark: suite loading and validation, a mini end-to-end run on a tiny model with a tiny character-level
tokenizer (no downloads), and the equality check catching an injected mismatch. Timings are never asserted."""

from __future__ import annotations

import json

import pytest
from conftest import noisy_copy, tiny_head, tiny_model

from leapdecode.cli import main as bench_main
from leapdecode.errors import LeapDecodeError
from leapdecode.lab.bench import methods as bench_methods
from leapdecode.lab.bench import runner as bench_runner
from leapdecode.lab.bench.methods import METHODS, parse_methods
from leapdecode.lab.bench.run import run_benchmark
from leapdecode.lab.bench.runner import BenchConfig, plan_variants
from leapdecode.lab.bench.suites import load_suite
from leapdecode.models import LoadedModel

CHAT = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def char_tokenizer():
    """A character-level fast tokenizer with a chat template, built offline."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", pad_token="<eos>")
    fast.chat_template = CHAT
    return fast


@pytest.fixture(scope="module")
def tiny():
    tok = char_tokenizer()
    target = tiny_model("llama", seed=3, vocab=len(tok))
    draft = noisy_copy(target, seed=4, noise=0.3)
    return (
        LoadedModel(model=target, tokenizer=tok, name="tiny-target", path="memory"),
        LoadedModel(model=draft, tokenizer=tok, name="tiny-draft", path="memory"),
    )


def write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


SMALL = [
    {"question_id": "a", "category": "chat", "turns": ["say abc abc abc", "and again abc abc"]},
    {"question_id": 2, "category": "copy", "turns": ["repeat: the cat sat on the mat, the cat sat on the"]},
]


# ---------------------------------------------------------------- suites


# the built-in suites' shape and generator: tests/test_suites.py


@pytest.mark.parametrize(
    "rows, message",
    [
        (["{not json"], ":1: not valid JSON"),
        ([{"question_id": 1, "turns": ["x"]}], "missing field 'category'"),
        ([{"question_id": 1, "category": "c", "turns": []}], "'turns' must be a non-empty list"),
        ([{"question_id": 1, "category": "c", "turns": ["ok", 3]}], "turn 2 must be a non-empty string"),
        (
            [{"question_id": 1, "category": "c", "turns": ["x"]}, {"question_id": 1, "category": "c", "turns": ["y"]}],
            ":2: duplicate question_id",
        ),
        (["[1, 2]"], "expected a JSON object"),
    ],
)
def test_bad_suite_files(tmp_path, rows, message):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(LeapDecodeError, match=message) as err:
        load_suite(path)
    assert "\n" not in str(err.value)


def test_suite_errors(tmp_path):
    with pytest.raises(LeapDecodeError, match="neither a built-in suite"):
        load_suite(str(tmp_path / "missing.jsonl"))
    with pytest.raises(LeapDecodeError, match="category 'nope' is not in suite"):
        load_suite("quick", ["nope"])
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(LeapDecodeError, match="has no questions"):
        load_suite(str(tmp_path / "empty.jsonl"))


def test_parse_methods():
    assert parse_methods("hf-generate, none", has_draft=False) == ["hf-generate", "none"]
    with pytest.raises(LeapDecodeError, match="unknown method 'fast'"):
        parse_methods("none,fast", has_draft=False)
    with pytest.raises(LeapDecodeError, match="needs a draft model"):
        parse_methods("draft-model", has_draft=False)
    with pytest.raises(LeapDecodeError, match="cannot sweep"):
        BenchConfig(methods=["none"], sweep=["none"])


def test_cli_bad_input_one_line(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert bench_main(["bench", "--model", "x", "--methods", "bogus", "--out", out]) == 2
    assert bench_main(["bench", "--model", "x", "--methods", "hf-assisted", "--out", out]) == 2
    assert bench_main(["bench", "--model", "x", "--suite", str(tmp_path / "none.jsonl"), "--out", out]) == 2
    assert bench_main(["bench", "--model", "x", "--draft-lengths", "2,x", "--out", out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("leapdecode: error: ") for line in lines)


# ---------------------------------------------------------------- end to end


def test_plan_variants_sweeps_oracle():
    labels = [
        v.label
        for v in plan_variants(
            BenchConfig(methods=["hf-generate", "ngram", "oracle"], draft_lengths=[4, 2], sweep=["ngram"])
        )
    ]
    assert labels == ["hf-generate", "ngram", "ngram@2", "ngram@4", "oracle@2", "oracle@4"]


def test_end_to_end_tiny(tiny, tmp_path):
    target, draft = tiny
    questions = load_suite(write_jsonl(tmp_path / "s.jsonl", SMALL))
    tiny_head(target.model, trained=True)[0].save(tmp_path / "head")
    cfg = BenchConfig(
        methods=list(METHODS),
        max_new_tokens=12,
        repeats=2,
        draft_lengths=[2, 4],
        sweep=["prompt-lookup"],
        head=str(tmp_path / "head"),
    )
    res = run_benchmark(target, questions, cfg, tmp_path / "out", draft=draft, suite="s", progress=False)
    data = json.loads(res.results.read_text())
    n_variants = len(METHODS) - 1 + 2 + 2  # oracle only swept; prompt-lookup also swept
    assert len(data["records"]) == 3 * 2 * n_variants  # 3 turns, 2 repeats
    assert len(data["references"]) == 3 and data["references"][1]["turn"] == 1
    assert data["summary"]["mismatched_outputs"] == 0
    overall = data["summary"]["groups"]["overall"]
    assert all(row["identical_share"] == 1.0 for row in overall.values())
    assert overall["hf-generate"]["speedup"] == 1.0 and overall["none"]["mean_accepted_tokens"] == 1.0
    assert overall["bare-forward"]["mean_accepted_tokens"] == 1.0
    assert data["summary"]["none_time_per_token_over_floor"] is not None
    assert set(data["forward_cost"]) == {"hf", "packed"}
    assert all(row["relative"]["1"] == 1.0 and len(row["ms"]) == 6 for row in data["forward_cost"].values())
    assert data["summary"]["oracle_best"] in ("oracle@2", "oracle@4")
    assert set(data["meta"]["setup"]) >= {"machine", "versions", "dtype", "command"}
    report = res.report.read_text()
    assert (
        "## Overall" in report
        and "Loop overhead" in report
        and "## Forward cost" in report
        and "identical to the greedy reference" in report
        and "MISMATCH" not in report
    )
    for png in res.plots:
        assert png.read_bytes()[:4] == b"\x89PNG"
    assert {p.name for p in res.plots} == {"speedup.png", "draft_length.png"}


def test_injected_mismatch_is_flagged(tiny, tmp_path, monkeypatch):
    target, _ = tiny
    real = bench_methods.run_variant

    def corrupt(ctx, variant, *args, **kw):
        m = real(ctx, variant, *args, **kw)
        if variant.method == "prompt-lookup" and len(m.token_ids) > 3:
            m.token_ids = m.token_ids[:3] + [(m.token_ids[3] + 1) % len(target.tokenizer)] + m.token_ids[4:]
        return m

    monkeypatch.setattr(bench_runner, "run_variant", corrupt)
    questions = load_suite(write_jsonl(tmp_path / "s.jsonl", SMALL[1:]))
    res = run_benchmark(
        target,
        questions,
        BenchConfig(methods=["hf-generate", "none", "prompt-lookup"], max_new_tokens=10, repeats=1),
        tmp_path / "out",
        progress=False,
    )
    data = json.loads(res.results.read_text())
    assert data["summary"]["mismatched_outputs"] == 1
    assert data["summary"]["groups"]["overall"]["prompt-lookup"]["identical_share"] == 0.0
    bad = next(r for r in data["records"] if not r["identical"])
    assert bad["first_difference"] == 3 and bad["divergence"]["position"] == 3
    assert bad["divergence"]["top2_margin"] > 0
    report = res.report.read_text()
    assert "MISMATCH" in report.split("## Setup")[0] and "LIKELY BUG" in report


@pytest.mark.slow
def test_cli_quick_smollm2(tmp_path):
    out = tmp_path / "quick"
    assert (
        bench_main(
            [
                "bench",
                "--model",
                "smollm2-135m",
                "--suite",
                "quick",
                "--max-new-tokens",
                "8",
                "--no-progress",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "results.json").exists() and (out / "report.md").exists()


def test_tie_margin_follows_the_dtype():
    """bf16 logits near 20 are 0.125 apart: a 0.125 margin is a rounding tie in bf16, a real gap in fp32."""
    import torch

    assert bench_methods.tie_margin(20.0, torch.bfloat16) > 0.125
    assert bench_methods.tie_margin(20.0, torch.float32) == 0.01


@pytest.mark.parametrize("corrupted", [True, False])
def test_cli_fail_on_mismatch_exits_3(tiny, tmp_path, monkeypatch, capsys, corrupted):
    """`leapdecode bench --fail-on-mismatch` exits 3 when an output was planted to differ from greedy, 0 otherwise."""
    import leapdecode.models

    target, _ = tiny
    monkeypatch.setattr(leapdecode.models, "load_model", lambda spec, dtype="float32": target)
    if corrupted:
        real = bench_methods.run_variant

        def corrupt(ctx, variant, *args, **kw):
            m = real(ctx, variant, *args, **kw)
            if variant.method == "prompt-lookup" and len(m.token_ids) > 2:
                m.token_ids = m.token_ids[:2] + [(m.token_ids[2] + 1) % len(target.tokenizer)] + m.token_ids[3:]
            return m

        monkeypatch.setattr(bench_runner, "run_variant", corrupt)
    suite = write_jsonl(tmp_path / "s.jsonl", SMALL[1:])
    code = bench_main(
        [
            "bench",
            "--model",
            "tiny",
            "--methods",
            "hf-generate,none,prompt-lookup",
            "--suite",
            suite,
            "--max-new-tokens",
            "8",
            "--repeats",
            "1",
            "--no-warmup",
            "--no-progress",
            "--fail-on-mismatch",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == (3 if corrupted else 0)
    assert ("MISMATCH" in capsys.readouterr().err) == corrupted


def test_each_method_keeps_one_conversations_prefix_cache():
    """bench gives a method's later turns its earlier turns' keys/values, and starts afresh with each question (so
    the bench holds one conversation per method, not the suite's)."""
    from leapdecode.lab.bench.methods import _prefix_cache

    first = [{"role": "user", "content": "q1"}]
    later = first + [{"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    cache = _prefix_cache("test-none-r0", first)
    assert _prefix_cache("test-none-r0", later) is cache
    assert _prefix_cache("test-head-r0", later) is not cache
    assert _prefix_cache("test-none-r0", first) is not cache
