"""The one-off conversion of a model to OpenVINO IR for the peer methods, cached under the leapdecode cache dir.

optimum-intel's exporter (`optimum-cli export openvino --task text-generation-with-past --weight-format fp32`, or
`int4 --group-size 32 --ratio 1.0` beside a q4 target, see `peer_precision`) is
what OpenVINO GenAI's users run; it pins its own torch and transformers, so it runs in a virtual environment of its
own, made on demand (once per OpenVINO version) next to the IR::

    <cache>/openvino/export-env-ov<version>/     python -m venv + optimum-intel, torch pinned to ours (CPU build where
                                                pip finds one; elsewhere set PIP_EXTRA_INDEX_URL to torch's CPU index)
    <cache>/openvino/<model>-<key>-ov<version>/  openvino_model.xml/.bin, openvino_tokenizer.xml, openvino_detokenizer.xml,
                                                 config files, leapdecode.json (written last: the entry is complete)

The key hashes the model's config, tokenizer and weight file sizes, so a different model under the same name is
converted again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pathlib
import subprocess
import sys
import time

from ...errors import LeapDecodeError, require
from ...models.quantize import dtype_name
from ...models.registry import build_cached, cache_dir, read_manifest

OPTIMUM_INTEL = "optimum-intel==2.2.0"  # the exporter version measured here (it needs transformers<5.6)
INSTALL_HINT = "pip install 'leapdecode[peers]'"
FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def openvino_version() -> str:
    """The installed OpenVINO's version (e.g. 2026.4.1), or a LeapDecodeError naming the extra to install."""
    try:
        importlib.metadata.version("openvino-genai")
        return importlib.metadata.version("openvino")
    except importlib.metadata.PackageNotFoundError:
        raise LeapDecodeError(f"the OpenVINO peer methods need OpenVINO GenAI: {INSTALL_HINT}") from None


def model_key(model_dir: pathlib.Path) -> str:
    """A short hash of what defines the model: config, tokenizer files, and the weight files' names and sizes."""
    h = hashlib.sha256()
    for name in FILES:
        path = model_dir / name
        h.update(name.encode() + (path.read_bytes() if path.exists() else b"-"))
    for path in sorted(model_dir.glob("*.safetensors")):
        h.update(f"{path.name}:{path.stat().st_size}".encode())
    return h.hexdigest()[:10]


def ir_dir(model_name: str, model_dir: pathlib.Path, version: str, weights: str = "fp32") -> pathlib.Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in model_name.rsplit("/", 1)[-1])
    suffix = "" if weights == "fp32" else f"-{weights}"
    return cache_dir() / "openvino" / f"{safe}-{model_key(model_dir)}-ov{version}{suffix}"


def peer_precision(target) -> tuple[str, str | None]:
    """(the IR's weight format, the inference precision to ask for) that match how leapdecode runs `target`: fp32
    weights and f32 inference for a float32 model; for a q4 model (4-bit weights in groups of 32, bf16 products)
    OpenVINO's int4 weights in groups of 32 (NNCF keeps the embedding and head at 8 bits, as our q4 does the head)
    and OpenVINO's own choice of inference and KV cache precision on this CPU (bf16 where it has native bf16)."""
    return ("int4", None) if dtype_name(target.model) == "q4" else ("fp32", "f32")


def ensure_ir(target, console=None) -> pathlib.Path:
    """The OpenVINO IR of `target` (a LoadedModel from a model directory), converting it on first use, with the
    weight format of `peer_precision`."""
    version = openvino_version()
    model_dir = pathlib.Path(target.path)
    require(
        (model_dir / "config.json").is_file(),
        f"the OpenVINO peers convert a model directory with config.json; '{target.path}' is not one",
    )
    weights = peer_precision(target)[0]
    out = ir_dir(target.name, model_dir, version, weights)
    if read_manifest(out) is not None:
        return out
    say = console.print if console is not None else (lambda text: print(text, file=sys.stderr))
    say(f"openvino: converting {target.name} to OpenVINO IR once ({weights} weights), cached in {out}")

    def build(work: pathlib.Path) -> dict:
        python = export_env(version, say)
        cmd = [
            str(python.parent / "optimum-cli"),
            "export",
            "openvino",
            "--model",
            str(model_dir),
            "--task",
            "text-generation-with-past",
            "--weight-format",
            weights,
            *(["--group-size", "32", "--ratio", "1.0"] if weights == "int4" else []),
            str(work / "model"),
        ]
        run_step(cmd, work.parent / f"{out.name}.export.log", "exporting with optimum-cli", say)
        require(
            (work / "model" / "openvino_model.xml").is_file() and (work / "model" / "openvino_tokenizer.xml").is_file(),
            f"optimum-cli wrote no openvino_model.xml / openvino_tokenizer.xml (see {work.parent / out.name}.export.log)",
        )
        return {"source": str(model_dir), "openvino": version, "exporter": OPTIMUM_INTEL, "weight_format": weights}

    return build_cached(out, build)


def export_env(version: str, say) -> pathlib.Path:
    """The exporter's own venv (python path), created and filled on first use; a marker file says it is complete."""
    import torch

    env = cache_dir() / "openvino" / f"export-env-ov{version}"
    python = env / "bin" / "python"
    marker = env / "leapdecode-complete"
    if marker.is_file() and python.exists():
        return python
    env.parent.mkdir(parents=True, exist_ok=True)
    log = env.parent / f"{env.name}.log"
    run_step([sys.executable, "-m", "venv", "--clear", str(env)], log, "creating the exporter's venv", say)
    tokenizers = importlib.metadata.version("openvino-tokenizers")
    packages = [OPTIMUM_INTEL, f"openvino=={version}", f"openvino-tokenizers=={tokenizers}"]
    packages.append(f"torch=={torch.__version__.split('+')[0]}")  # unpinned, pip would take a multi-GB CUDA build
    run_step(
        [str(python), "-m", "pip", "install", "--progress-bar", "off", *packages],
        log,
        f"installing {' '.join(packages)} (about 1.5 GB, once per OpenVINO version)",
        say,
    )
    # optimum-intel requires torchvision, whose PyPI build does not import beside a CPU build of torch ("operator
    # torchvision::nms does not exist") and breaks transformers' imports; a text model's export never needs it
    run_step([str(python), "-m", "pip", "uninstall", "-y", "torchvision"], log, "removing torchvision", say)
    marker.write_text(" ".join(packages) + "\n")
    return python


def run_step(cmd: list[str], log: pathlib.Path, what: str, say, peer: str = "openvino") -> None:
    """Run one install or conversion step with its output in `log`, a line with the elapsed time every 30 s while it
    runs (never reaching for a model hub)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    start = time.monotonic()
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        say(f"{peer}:   {what} …")
        last = start
        while proc.poll() is None:
            time.sleep(0.5)
            if time.monotonic() - last >= 30:
                last = time.monotonic()
                say(f"{peer}:   … {last - start:.0f} s")
    if proc.returncode != 0:
        tail = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        raise LeapDecodeError(f"{peer}: {what} failed ({tail[-1][:200] if tail else 'no output'}); full log: {log}")
    say(f"{peer}:   {what}: done in {time.monotonic() - start:.0f} s")
