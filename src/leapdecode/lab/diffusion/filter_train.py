"""Train the Learn2PD filter post hoc on traces of the reference decode (one token per forward).

At every step of the reference decode, each masked position gets a feature vector (decoders/learn2pd.py) and the label
"the model's current argmax here equals the token this position finally gets". The filter is a 2-layer MLP trained
with binary cross-entropy; everything is seeded, so the same seed gives the same weights.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from torch import nn

from ...diffusion.decoders.fixed_steps import FixedStepsDecoder
from ...diffusion.decoders.learn2pd import PositionFilter, position_features
from ...diffusion.interface import DiffusionLM
from ...diffusion.loop import diffusion_decode
from ...errors import require
from .tasks import GEN_LEN, CharTokenizer, encode_prompts, resolve_tasks, sample


def collect_traces(
    lm: DiffusionLM, tok: CharTokenizer, tasks: list[str], per_task: int, seed: int, gen_len: int = GEN_LEN
) -> tuple[torch.Tensor, torch.Tensor, list]:
    """(features [N, F], labels [N]) from reference decodes of training-split prompts; also the DecodeResults."""
    rng = random.Random(seed)
    feats, labels, results = [], [], []
    for task in tasks:
        examples = [sample(task, rng, heldout=False) for _ in range(per_task)]
        prompts = encode_prompts(tok, [e.prompt for e in examples])
        res = diffusion_decode(
            lm, prompts, gen_len, FixedStepsDecoder(steps=gen_len), record_trace=True, feature_fn=position_features
        )
        results.append(res)
        for step in res.trace:
            final = res.canvas[step["rows"]]
            sel = step["eligible"]
            feats.append(step["features"][sel])
            labels.append((step["argmax"] == final)[sel].float())
    return torch.cat(feats), torch.cat(labels), results


def fit_filter(
    features: torch.Tensor,
    labels: torch.Tensor,
    seed: int = 0,
    epochs: int = 40,
    hidden: int = 32,
    lr: float = 3e-3,
    batch_size: int = 1024,
) -> tuple[PositionFilter, dict]:
    require(len(labels) > 0, "no trace samples to train the filter on")
    torch.manual_seed(seed)
    model = PositionFilter(features.shape[1], hidden)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    n_val = max(1, len(labels) // 10)
    order = torch.randperm(len(labels), generator=gen)
    val, trn = order[:n_val], order[n_val:]
    loss_fn = nn.BCEWithLogitsLoss()
    for _ in range(epochs):
        perm = trn[torch.randperm(len(trn), generator=gen)]
        for i in range(0, len(perm), batch_size):
            idx = perm[i : i + batch_size]
            loss = loss_fn(model(features[idx]), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        p = torch.sigmoid(model(features[val]))
        acc = ((p >= 0.5).float() == labels[val]).float().mean().item()
        sure = p >= 0.9
        precision = round(labels[val][sure].mean().item(), 4) if sure.any() else None
    return model, {
        "samples": len(labels),
        "positive_rate": round(labels.mean().item(), 4),
        "val_accuracy": round(acc, 4),
        "val_precision_at_0.9": precision,
    }


def train_filter(
    lm: DiffusionLM,
    out: str | Path,
    tasks: list[str] | None = None,
    per_task: int = 64,
    seed: int = 0,
    epochs: int = 40,
    log=print,
) -> dict:
    """Collect reference traces, fit the filter, save it next to the model; returns the training record."""
    require(per_task > 0, f"--per-task must be positive, got {per_task}")
    require(epochs > 0, f"--epochs must be positive, got {epochs}")
    start = time.time()
    tok = CharTokenizer()
    feats, labels, _ = collect_traces(lm, tok, resolve_tasks(tasks), per_task, seed)
    traced = time.time() - start
    model, stats = fit_filter(feats, labels, seed=seed, epochs=epochs)
    stats.update(
        {
            "trace_seconds": round(traced, 1),
            "train_seconds": round(time.time() - start, 1),
            "seed": seed,
            "per_task": per_task,
            "epochs": epochs,
        }
    )
    model.save(out, {"training": stats})
    log(
        f"Learn2PD filter: {stats['samples']} samples, val accuracy {stats['val_accuracy']:.3f}, "
        f"{stats['train_seconds']:.0f} s in all; saved to {out}"
    )
    return stats
