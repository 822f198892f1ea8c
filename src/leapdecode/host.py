"""What the host is doing right now: whether other processes compete for the CPUs (kernel calibration and the
benchmarks both refuse to trust timings taken on a busy machine)."""

from __future__ import annotations

import os
import time


def other_load() -> float | None:
    """How many tasks of other processes compete for the CPUs right now: Linux's `procs_running` less the thread that
    reads it, the median of samples a few ms apart; elsewhere the 1-minute load average; None where neither is known.
    The load average lags and counts this process's own recent work: right after loading a model it reads as busy on
    an idle machine."""
    counts = []
    for _ in range(15):
        time.sleep(3e-3)  # lets this process's own worker threads settle
        try:
            with open("/proc/stat") as f:
                counts += [int(line.split()[1]) - 1 for line in f if line.startswith("procs_running")]
        except (OSError, ValueError, IndexError):
            break
    if counts:
        return sorted(counts)[len(counts) // 2]
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def oversubscribed(load: float | None, threads: int) -> bool:
    """Whether `load` other tasks (other_load()) leave `threads` torch threads fewer cores than they need: timings
    then measure how processes share the CPUs, not the code."""
    return load is not None and load + threads > (os.cpu_count() or 1) + 0.5


def available_memory() -> int | None:
    """Bytes the OS could give this process now without swapping (Linux's MemAvailable), or None where unknown."""
    return proc_bytes("/proc/meminfo", "MemAvailable")


def proc_bytes(path: str, key: str) -> int | None:
    """The `key: N kB` line of a Linux /proc file (meminfo, a process's status) in bytes, or None where unknown."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def release_openmp_threads() -> bool:
    """Give back the calling thread's idle OpenMP workers (`omp_pause_resource_all`, soft: they are made again on
    demand). Each thread that runs torch's parallel work gets a team of its own; when another thread takes the work
    over (the server's engine thread, after the model was loaded and calibrated in the main one), the old team's
    workers kept competing with the new one for the cores: a decode step took about 1.5 times as long. Returns whether
    the runtime took the call (False where there is no libgomp with OpenMP 5.0's pause)."""
    import ctypes

    try:
        return ctypes.CDLL("libgomp.so.1").omp_pause_resource_all(1) == 0  # 1: omp_pause_soft
    except (OSError, AttributeError):
        return False
