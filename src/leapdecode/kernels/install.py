"""Giving a model leapdecode's kernels: route its linear layers (packed.py) and give each its calibrated plan
(calibrate.py), once per model; the forwards switch them on with `packed_kernels` / `argmax_logits`."""

from __future__ import annotations

import torch

from .calibrate import assign_plans
from .packed import _settings, installed, route_argmax_head, route_linear


def install_packed_linear(model: torch.nn.Module) -> None:
    """Let the model's CPU fp32/bf16 nn.Linear layers run on the chosen linear path while `packed_kernels` is on, and
    give them their calibrated plans (measured once per host and shape, then read from the disk cache). The parts a
    fused decoder joined (fused_decoder.py: q/k/v, gate/up) are routed but not timed: the fused layers run in their
    place, and a part called anyway takes F.linear (`chosen_path` without a plan), its result as before."""
    route_linear(model)
    if _settings["linear"] == "auto":
        assign_plans([m for m in installed(model) if not getattr(m, "_leapdecode_fused_part", False)])


def install_argmax_head(model: torch.nn.Module) -> bool:
    """Let the model's fp32 output head (without bias) run as an ArgmaxOutputHead under `argmax_logits(True)` where
    that is faster here (or forced on); returns whether it may."""
    head = route_argmax_head(model)
    if head is None:
        return False
    if _settings["linear"] == "auto" or _settings["argmax_head"] == "auto":
        assign_plans([head])
    return True
