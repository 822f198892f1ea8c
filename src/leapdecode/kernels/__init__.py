"""CPU kernels the Runner uses inside its own forwards, chosen per host by measurement.

- `install_packed_linear` routes a model's fp32/bf16 `nn.Linear` layers through a per-call choice of linear path
  (`F.linear`, `native_linear`'s panel kernel, a weight pre-packed once into oneDNN's blocked layout, with or without
  padding to four rows), active only under `packed_kernels(...)`: HF `generate` and the bench's baselines keep
  `F.linear`.
- `install_argmax_head` lets a greedy decode's output head run as an ArgmaxOutputHead (bf16, exact argmax).
- `fused_decoder` runs Llama/Qwen2 models in one flat loop over their own modules, q/k/v and gate/up fused
  (`configure(decoder="hf")` keeps the model's own forward).
- `calibrate` measures the paths per layer shape, dtype and row count on this host (cached on disk) and `kernel_table`
  / `describe_kernels` show what was chosen; `configure(linear=..., argmax_head=...)` forces a choice instead.
- `decoder_ops`: the fused decoder's RMSNorm, rotary embedding and SiLU in one native call each
  (`configure(elementwise="torch")` keeps torch's operations).
- `native` builds these C kernels (csrc/) once per host; `settings` holds the process's choices and the cache dir.
- `segment_attention` attends the rows of every sequence of a flat batch (decode, verification, prompt chunks up to
  512 rows) in one native call per layer (a small C kernel built once per host; torch's SDPA per sequence where it
  cannot be built, or with `configure(attention="sdpa")` / LEAPDECODE_ATTENTION=sdpa).
- `decoder_step` runs a fused decoder's whole step through every layer in one native call where all the kernels
  above apply (the same C functions in the same order: the same bits; `configure(step="layers")` turns it off).
- `whole_step` checks the choice on the forward itself: per row count, every layer on the panel kernel (one native
  call a step, codes where a weight has them) or each on its calibrated path, whichever runs the whole step faster.
- `ops` checks the private `torch.ops.mkldnn` ops once: where they are missing or fail, `F.linear` is used with a
  one-line notice.
bf16 packed results equal `F.linear`'s bit for bit; fp32 ones differ in rounding (~1e-6 relative), like any two GEMMs.
"""

from .argmax_head import BF16_ROUNDING, ArgmaxOutputHead, fast_bf16
from .calibrate import BUCKETS, Plan, bf16_pays, cache_file
from .install import install_argmax_head, install_packed_linear
from .ops import PAD_ROWS, packed_matmul, packed_ops
from .packed import (
    ARGMAX_PATHS,
    LINEAR_PATHS,
    MODES,
    argmax_logits,
    chosen_path,
    configure,
    configured,
    packed_kernels,
    settings,
)
from .report import describe_kernels, kernel_table

_packed_matmul = packed_matmul  # the name tests and older callers use

__all__ = [
    "ARGMAX_PATHS",
    "ArgmaxOutputHead",
    "BF16_ROUNDING",
    "BUCKETS",
    "LINEAR_PATHS",
    "MODES",
    "PAD_ROWS",
    "Plan",
    "argmax_logits",
    "bf16_pays",
    "cache_file",
    "chosen_path",
    "configure",
    "configured",
    "describe_kernels",
    "fast_bf16",
    "install_argmax_head",
    "install_packed_linear",
    "kernel_table",
    "packed_kernels",
    "packed_ops",
    "settings",
]
