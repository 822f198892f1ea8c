"""The private oneDNN ops behind pre-packed weights (`torch.ops.mkldnn.*`), and a check run once per process and dtype
before any of them is used: a torch build or CPU where they are missing, fail or compute wrong results makes
leapdecode fall back to `F.linear` with a one-line notice instead of a traceback."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger("leapdecode")

# oneDNN reads a packed weight faster with 4 input rows than with 1-3 on some CPUs (its few-row kernels stream memory
# worse), so the "packed-pad" path zero-pads fewer rows to four; calibration decides per host whether that pays
PAD_ROWS = 4
_checked: dict[torch.dtype, str | None] = {}  # dtype -> None when the ops work, else why not
_noticed: set[str] = set()


def reorder(weight: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] packed once into oneDNN's blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def linear_pointwise(flat: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")


def packed_matmul(
    flat: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, pad: bool = True
) -> torch.Tensor:
    """flat [rows, in] @ packed weight (+ bias); with `pad`, fewer than PAD_ROWS rows are zero-padded to PAD_ROWS."""
    rows = flat.shape[0]
    if pad and rows < PAD_ROWS:
        flat = torch.cat([flat, flat.new_zeros(PAD_ROWS - rows, flat.shape[1])])
        return linear_pointwise(flat, packed, bias)[:rows]
    return linear_pointwise(flat, packed, bias)


def packed_ops(dtype: torch.dtype = torch.float32) -> bool:
    """Whether the packed ops exist and compute `F.linear`'s results in `dtype` here (checked once per dtype)."""
    if dtype not in _checked:
        _checked[dtype] = _check(dtype)
        reason = _checked[dtype]
        if reason is not None:  # fp32's fallback is a warning; bf16's is expected on CPUs without bf16 support
            message = f"pre-packed oneDNN kernels unavailable for {str(dtype).removeprefix('torch.')} ({reason})"
            if dtype == torch.float32:
                notice(message + "; using F.linear")
            else:
                log.info("leapdecode: %s; using F.linear", message)
    return _checked[dtype] is None


def unavailable_reason(dtype: torch.dtype = torch.float32) -> str | None:
    packed_ops(dtype)
    return _checked[dtype]


def forget_checks() -> None:
    """Run the checks again on next use (tests that break an op on purpose)."""
    _checked.clear()
    _noticed.clear()


def notice(message: str) -> None:
    """One line on leapdecode's logger, once per message: no traceback, whatever the cause."""
    if message not in _noticed:
        _noticed.add(message)
        log.warning("leapdecode: %s", message)


def _check(dtype: torch.dtype) -> str | None:
    try:
        if not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN"
        gen = torch.Generator().manual_seed(0)
        weight, bias = torch.randn(24, 40, generator=gen), torch.randn(24, generator=gen)
        x = torch.randn(5, 40, generator=gen)
        weight, bias, x = weight.to(dtype), bias.to(dtype), x.to(dtype)
        packed = reorder(weight)
        tol = 1e-4 if dtype == torch.float32 else 5e-2
        for rows, pad in ((1, True), (3, False), (5, False)):
            got, want = packed_matmul(x[:rows], packed, bias, pad), F.linear(x[:rows], weight, bias)
            if got.shape != want.shape or not torch.allclose(got.float(), want.float(), atol=tol, rtol=tol):
                return "results differ from F.linear"
    except Exception as e:  # noqa: BLE001 - any failure of a private op means: do not use it
        return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"
    return None
