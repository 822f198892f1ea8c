"""The process's kernel settings, the host's identity and where kernels keep what they measure or build. Every other
kernel module reads this one; it reads none of them."""

from __future__ import annotations

import functools
import os
import pathlib
import platform

# linear: "auto" (calibrated per host) or a path forced everywhere; argmax_head: "auto" (where calibration found it
# faster), "on" (always, where greedy asks for it) or "off"; decoder: "fused" (kernels.fused_decoder where the model
# is supported) or "hf" (the model's own forward); attention: "native" (kernels.segment_attention for a flat batch's
# decode and verification rows, where it builds) or "sdpa" (torch's, one call per sequence; also
# LEAPDECODE_ATTENTION=sdpa); elementwise: "native" (kernels.decoder_ops for the fused decoder's norms, rotary
# embedding and activation, where the model's layers are supported) or "torch"; step: "native" (kernels.decoder_step: a decode
# or verification step through every layer in one native call, where all its kernels are native) or "layers";
# native_weights: "codes" (the native linear path keeps a weight that is exactly a 4- or 8-bit weight widened to fp32
# as those codes: same bits, a sixth or a third of the bytes; LEAPDECODE_NATIVE_WEIGHTS=fp32 turns it off) or "fp32";
# cache_dir: where calibrations and
# built libraries are kept (None: the user cache dir). Changed through packed.configure.
_settings: dict = {
    "linear": "auto",
    "argmax_head": "auto",
    "decoder": "fused",
    "attention": "sdpa" if os.environ.get("LEAPDECODE_ATTENTION") == "sdpa" else "native",
    "elementwise": "native",
    "step": "native",
    "native_weights": "fp32" if os.environ.get("LEAPDECODE_NATIVE_WEIGHTS") == "fp32" else "codes",
    "cache_dir": None,
}


def cache_dir() -> pathlib.Path:
    if _settings["cache_dir"] is not None:
        return pathlib.Path(_settings["cache_dir"])
    import platformdirs

    return pathlib.Path(platformdirs.user_cache_dir("leapdecode"))


@functools.cache
def host_cpu() -> str:
    """The CPU's model name and flags."""
    cpu, flags = platform.processor() or platform.machine(), ""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name") and cpu in ("", platform.machine(), platform.processor()):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")) and not flags:
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return f"{cpu}|{flags}"
