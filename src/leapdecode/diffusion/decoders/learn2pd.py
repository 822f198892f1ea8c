"""Learn2PD (learnable parallel decoding): a tiny filter over per-position features (confidence, margin, entropy,
stability across steps, position, step) predicts whether the current prediction already equals the final output;
every masked position it accepts is committed. Trained post hoc on reference-decode traces (see filter_train.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ...errors import require
from ..loop import Commit, StepView
from .base import Decoder
from .threshold import check_threshold

FEATURES = ["confidence", "margin", "entropy", "stability", "position", "block_offset", "step", "masked_fraction"]
FILTER_FILE, FILTER_CONFIG = "learn2pd_filter.safetensors", "learn2pd_filter.json"


def position_features(view: StepView) -> torch.Tensor:
    """[B, L, len(FEATURES)] features of every position at this step (only masked ones are ever used)."""
    probs = view.probs
    top2 = probs.topk(2, dim=-1).values
    entropy = -(probs * probs.clamp_min(1e-12).log()).sum(-1) / math.log(probs.shape[-1])
    b, length = view.canvas.shape
    pos = torch.arange(length, dtype=torch.float).expand(b, length)
    first = torch.where(view.eligible, pos, torch.full_like(pos, float(length))).min(1, keepdim=True).values
    cols = [
        top2[..., 0],
        top2[..., 0] - top2[..., 1],
        entropy,
        view.stable.float().clamp(max=8) / 8,
        (pos - view.gen_start) / view.gen_len,
        ((pos - first) / view.block_len).clamp(0, 1),
        (view.step.float() / view.gen_len).unsqueeze(1).expand(b, length),
        (view.masked.sum(1).float() / view.gen_len).unsqueeze(1).expand(b, length),
    ]
    return torch.stack(cols, -1)


class PositionFilter(nn.Module):
    """The Learn2PD filter: features -> logit of "this prediction is already final"."""

    def __init__(self, n_features: int = len(FEATURES), hidden: int = 32) -> None:
        super().__init__()
        self.hidden = hidden
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)

    def save(self, directory: str | Path, meta: dict | None = None) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(directory / FILTER_FILE))
        (directory / FILTER_CONFIG).write_text(
            json.dumps({"features": FEATURES, "hidden": self.hidden, **(meta or {})}, indent=1)
        )

    @classmethod
    def load(cls, directory: str | Path) -> "PositionFilter":
        directory = Path(directory)
        require(
            (directory / FILTER_FILE).is_file(),
            f"no Learn2PD filter at {directory}; train one with `leapdecode dllm train-filter`",
        )
        cfg = json.loads((directory / FILTER_CONFIG).read_text())
        require(cfg["features"] == FEATURES, f"filter at {directory} was trained on other features")
        model = cls(len(FEATURES), cfg["hidden"])
        model.load_state_dict(load_file(str(directory / FILTER_FILE)))
        return model.eval()


class Learn2PDDecoder(Decoder):
    name = "learn2pd"

    def __init__(self, filter_model: PositionFilter, threshold: float = 0.9) -> None:
        self.filter, self.threshold = filter_model, check_threshold(threshold)

    @torch.no_grad()
    def select(self, view: StepView) -> Commit:
        score = torch.sigmoid(self.filter(position_features(view)))
        return Commit(view.eligible & (score >= self.threshold))

    def describe(self) -> str:
        return f"learn2pd({self.threshold:g})"
