"""Small C kernels (csrc/*.c) compiled once per host with the system's C compiler and loaded with ctypes.

Each library is built on first use (about a second) and cached under the user cache dir, keyed by its source, the
compiler, the CPU and the instruction set torch dispatches to: a cap such as ATEN_CPU_CAPABILITY=avx2 builds for
AVX2. The kernels run on torch's own OpenMP runtime (same soname, so the same threads); a compiler without OpenMP
builds them single-threaded. Where there is no compiler or the build fails, the library is None after a one-line
notice and its caller stays on torch's kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
from typing import Callable

import torch

from .ops import notice
from .settings import cache_dir, host_cpu

CSRC = pathlib.Path(__file__).with_name("csrc")
_libraries: list[NativeLibrary] = []


def march_flags() -> list[str]:
    """Compiler flags for the instruction set torch dispatches to here (honouring ATEN_CPU_CAPABILITY)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    isa = torch.backends.cpu.get_cpu_capability()
    if isa.startswith("AVX512"):
        return ["-march=native"]
    if isa == "AVX2":
        return ["-mavx2", "-mfma", "-mf16c"]
    return []


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def library_path(source: pathlib.Path, compiler: str, flags: list[str]) -> pathlib.Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    included = [f.read_text() for f in sorted(source.parent.glob("*.[ch]"))]  # what the source may include
    key = "|".join([source.read_text(), *included, compiler, version, " ".join(flags), host_cpu(), torch.__version__])
    return cache_dir() / "native" / f"{source.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def build(compiler: str, source: pathlib.Path, path: pathlib.Path, flags: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = pathlib.Path(tmp) / path.name
        for threads in (["-fopenmp"], []):
            command = [compiler, "-O3", *threads, "-shared", "-fPIC", *flags, str(source), "-o", str(out)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                break
        else:
            raise RuntimeError((done.stderr.strip().splitlines() or ["compiler failed"])[-1][:160])
        os.replace(out, path)  # atomic: another process building the same library at once is harmless


def forget_all() -> None:
    """Check, build if needed and load every library again on next use (tests that take the compiler away)."""
    for library in _libraries:
        library.forget()


class NativeLibrary:
    """csrc/`name`.c as a ctypes library, built and loaded on first `get()`. `signatures`: function name ->
    (restype, argtypes). `enabled()` says whether the settings want it at all; `what` names it in the notice given
    when it cannot be built, which ends with `fallback` (what runs instead)."""

    def __init__(self, name: str, signatures: dict, enabled: Callable[[], bool], what: str, fallback: str):
        self.source = CSRC / f"{name}.c"
        self.signatures, self.enabled, self.what, self.fallback = signatures, enabled, what, fallback
        self.forget()
        _libraries.append(self)

    def get(self) -> ctypes.CDLL | None:
        if not self.enabled():
            return None
        if not self._checked:
            self._checked = True
            try:
                self._lib = self._load()
            except Exception as error:  # noqa: BLE001 - any failure means: torch's kernels instead
                self._why_not = f"{type(error).__name__}: {error}"
                notice(f"{self.what} unavailable ({self._why_not}); {self.fallback}")
        return self._lib

    def why_not(self) -> str | None:
        """Why the library is not in use (None when it is)."""
        self.get()
        return self._why_not if self._lib is None else None

    def forget(self) -> None:
        """Check, build if needed and load again on next use (tests)."""
        self._lib, self._why_not, self._checked = None, None, False

    def _load(self) -> ctypes.CDLL:
        cc = compiler()
        if cc is None:
            raise RuntimeError("no C compiler found (set CC)")
        flags = march_flags()
        path = library_path(self.source, cc, flags)
        if not path.exists():
            build(cc, self.source, path, flags)
        lib = ctypes.CDLL(str(path))
        for function, (restype, argtypes) in self.signatures.items():
            getattr(lib, function).restype = restype
            getattr(lib, function).argtypes = argtypes
        return lib
