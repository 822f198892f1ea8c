"""The CLI: JSON output, and one clear error line (exit 2, no traceback) for every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tiny_hf import WORDS, make_tiny_hf_dir

from leapdecode.cli import main


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(make_tiny_hf_dir(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def other_tokenizer_dir(tmp_path_factory):
    words = WORDS[:4] + [f"x{i}" for i in range(64)]
    return str(make_tiny_hf_dir(tmp_path_factory.mktemp("other"), words=words, seed=1))


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json(capsys, tiny_dir):
    code, out, _ = run_cli(
        capsys,
        "generate",
        "hello world w1 w2 w1 w2",
        "--model",
        tiny_dir,
        "--json",
        "--max-new-tokens",
        "12",
        "--drafter",
        "prompt-lookup",
    )
    assert code == 0
    result = json.loads(out)
    for key in (
        "text",
        "token_ids",
        "new_tokens",
        "forward_passes",
        "mean_accepted_tokens",
        "tokens_per_second",
        "model",
        "drafter",
    ):
        assert key in result
    assert result["drafter"] == "prompt-lookup"
    assert 1 <= result["new_tokens"] == len(result["token_ids"]) <= 12


def test_generate_streams_text(capsys, tiny_dir, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich draws its progress line as on a terminal
    code, out, err = run_cli(
        capsys, "generate", "hello world", "--model", tiny_dir, "--max-new-tokens", "5", "--drafter", "ngram"
    )
    assert code == 0
    assert "tok/s" in err and "forward passes" in err
    assert "kernels (once)" in err  # the one-off preparation before the first token is shown, not silent


def test_generate_streams_the_text_of_json_and_ends_at_stop(capsys, tiny_dir):
    args = ("generate", "w1 w7", "--model", tiny_dir, "--raw", "--max-new-tokens", "20", "--drafter", "prompt-lookup")
    full = json.loads(run_cli(capsys, *args, "--json")[1])
    code, out, _ = run_cli(capsys, *args)
    assert code == 0 and out == full["text"] + "\n"  # the streamed text is the answer's, then one newline
    words = full["text"].split()
    stop = " ".join(words[3:5])  # the first place it occurs ends the answer
    cut = json.loads(run_cli(capsys, *args, "--json", "--stop", "never there", "--stop", stop)[1])
    assert cut["text"] == full["text"][: full["text"].index(stop)] and cut["stop_reason"] == "stop"
    assert run_cli(capsys, *args, "--stop", stop)[1] == cut["text"] + "\n"


def test_generate_json_prints_only_json(capsys, tiny_dir, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    code, out, err = run_cli(capsys, "generate", "hello", "--model", tiny_dir, "--json", "--max-new-tokens", "3")
    assert code == 0 and json.loads(out)["new_tokens"] >= 1
    assert "kernels (once)" not in err


def test_generate_with_a_prediction_file_gives_the_same_answer(capsys, tiny_dir, tmp_path):
    args = ["generate", "hello world w1 w2", "--model", tiny_dir, "--json", "--max-new-tokens", "16"]
    code, out, _ = run_cli(capsys, *args, "--drafter", "none")
    plain = json.loads(out)
    predicted = tmp_path / "answer.txt"
    predicted.write_text(plain["text"])
    # a fixed draft length: what is accepted then does not depend on how the host timed drafting
    code, out, _ = run_cli(capsys, *args, "--drafter", "none", "--prediction", str(predicted), "--fixed-draft-length")
    result = json.loads(out)
    assert code == 0 and result["token_ids"] == plain["token_ids"]
    assert result["prediction_tokens"] > 0 and result["accepted_prediction_tokens"] > 0
    assert result["forward_passes"] < plain["forward_passes"]


def test_draft_model_with_same_tokenizer_runs(capsys, tiny_dir):
    code, out, _ = run_cli(
        capsys,
        "generate",
        "hello",
        "--model",
        tiny_dir,
        "--drafter",
        "draft-model",
        "--draft-model",
        tiny_dir,
        "--json",
        "--max-new-tokens",
        "8",
    )
    assert code == 0 and json.loads(out)["drafter"] == "draft-model"


def test_draft_model_with_the_default_drafter_drafts_with_it(capsys, tiny_dir):
    """--draft-model alone (drafter auto) means: draft with that model, not the default drafter."""
    code, out, _ = run_cli(
        capsys, "generate", "hello", "--model", tiny_dir, "--draft-model", tiny_dir, "--json", "--max-new-tokens", "6"
    )
    assert code == 0 and json.loads(out)["drafter"] == "draft-model"


def test_default_drafter_is_the_shipped_head_or_prompt_lookup(capsys, tiny_dir):
    from leapdecode.drafters.factory import default_drafter

    assert default_drafter("smollm2-135m") == "head"
    assert default_drafter(tiny_dir) == default_drafter("org/model") == default_drafter("") == "prompt-lookup"
    code, out, _ = run_cli(capsys, "generate", "hello", "--model", tiny_dir, "--json", "--max-new-tokens", "4")
    assert code == 0 and json.loads(out)["drafter"] == "prompt-lookup"


BAD_INPUTS = {
    "unknown model": (["--model", "no-such-model-xyz"], "unknown model"),
    "missing gguf": (["--model", "/nonexistent/dir/model.gguf"], "not found"),
    "empty prompt": (["--prompt-override", "   "], "empty"),
    "prompt too long": (["--prompt-override", " ".join(["w1"] * 80)], "context"),
    "max_new_tokens 0": (["--max-new-tokens", "0"], "max_new_tokens"),
    "max_new_tokens negative": (["--max-new-tokens", "-3"], "max_new_tokens"),
    "negative temperature": (["--temperature", "-0.5"], "temperature"),
    "top_p zero": (["--temperature", "1", "--top-p", "0"], "top_p"),
    "top_p above one": (["--temperature", "1", "--top-p", "1.5"], "top_p"),
    "draft-model without a draft model": (["--drafter", "draft-model"], "draft model"),
    "bad dtype": (["--dtype", "int3"], "dtype"),
    "bad draft length": (["--draft-length", "0"], "draft length"),
    "draft model with another drafter": (
        ["--drafter", "ngram", "--draft-model", "{tiny}"],
        "used only by the draft-model drafter, not by 'ngram'",
    ),
    "missing weights": (
        ["--model", "{missing}"],
        "model.safetensors does not match its config.json: missing "
        "model.layers.1.input_layernorm.weight, model.layers.1.mlp.down_proj.weight",
    ),
    "unexpected weights": (["--model", "{unexpected}"], "config.json: unexpected model.extra.weight"),
    "suffix without fill-in-the-middle tokens": (["--suffix", "w1"], "no fill-in-the-middle tokens"),
    "unreadable prediction": (["--prediction", "/nonexistent/answer.txt"], "--prediction: cannot read"),
    "misshapen weights": (["--model", "{misshapen}"], "config.json: wrong shape model.norm.weight"),
}


@pytest.fixture(scope="module")
def broken_dirs(tmp_path_factory, tiny_dir):
    """Copies of tiny_dir whose weights lack layer 1, have an extra tensor, or a tensor of the wrong shape."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(f"{tiny_dir}/model.safetensors")
    variants = {
        "missing": {k: v for k, v in state.items() if "layers.1." not in k},
        "unexpected": {**state, "model.extra.weight": torch.zeros(3)},
        "misshapen": {**state, "model.norm.weight": torch.ones(7)},
    }
    dirs = {"tiny": tiny_dir}
    for name, tensors in variants.items():
        path = tmp_path_factory.mktemp(name)
        shutil.copytree(tiny_dir, path, dirs_exist_ok=True)
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        dirs[name] = str(path)
    return dirs


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gets_one_line(capsys, tiny_dir, broken_dirs, case):
    extra, needle = BAD_INPUTS[case]
    extra = [arg.format(**broken_dirs) for arg in extra]
    prompt = "hello world"
    if extra[0] == "--prompt-override":
        prompt, extra = extra[1], extra[2:]
    if "--model" not in extra:
        extra = ["--model", tiny_dir] + extra
    code, _, err = run_cli(capsys, "generate", prompt, *extra)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith("leapdecode: error:"), err
    assert needle.lower() in lines[0].lower()


def test_corrupt_gguf(capsys, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a gguf file" * 100)
    code, _, err = run_cli(capsys, "generate", "hi", "--model", str(bad))
    assert code == 2 and err.count("\n") == 1 and "gguf" in err.lower()


def test_other_tokenizer_draft_is_refused(capsys, tiny_dir, other_tokenizer_dir):
    code, _, err = run_cli(
        capsys,
        "generate",
        "hello",
        "--model",
        tiny_dir,
        "--drafter",
        "draft-model",
        "--draft-model",
        other_tokenizer_dir,
    )
    assert code == 2 and "different tokenizer" in err and err.count("\n") == 1


def test_console_script_prints_no_traceback(tiny_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "leapdecode.cli", "generate", "", "--model", tiny_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip() == "leapdecode: error: the prompt is empty"
