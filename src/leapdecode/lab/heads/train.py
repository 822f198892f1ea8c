"""Train a draft head on the target's features over its own greedy answers.

Each example starts at an answer position i: the head gets the target's feature F[i] (which predicts answer[i]) and
then runs `depth` steps on its own predictions, fed the true tokens answer[i..i+depth-1] (EAGLE-3's "training-time
test": at inference the head also feeds on what it predicted, so it is trained that way). Step j is scored by the
cross-entropy of its logits against answer[i+j] (the target's greedy token) plus a feature regression towards
F[i+j]. The held-out split reports top-1 agreement per step and the mean number of tokens a chain draft would get
accepted — the quantity that makes decoding faster.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from ...heads.model import DraftHead, HeadConfig
from ...kernels import install_packed_linear, packed_kernels

IGNORE = -100


@dataclass
class HeadTrainConfig:
    vocab: int = 4096  # output tokens the head can propose: the most frequent in the training answers
    intermediate: int = 1536
    depth: int = 3  # unrolled steps per example
    epochs: int = 4
    batch_size: int = 256
    lr: float = 1e-3
    reg_weight: float = 0.5  # weight of the feature regression against the token cross-entropy
    val_share: float = 0.05
    seed: int = 0


@torch.inference_mode()
def features(model, records: list[dict], progress=None) -> list[torch.Tensor]:
    """Per record: the target's final-norm hidden states F[i] for i = 0..len(answer)-1, F[i] predicting answer[i]."""
    captured = {}
    hook = model.get_decoder().norm.register_forward_hook(lambda m, i, o: captured.__setitem__("h", o))
    install_packed_linear(model)
    out = []
    try:
        for r in records:
            ids = r["prompt_ids"] + r["answer_ids"]
            with packed_kernels(True):
                model(input_ids=torch.tensor([ids]), logits_to_keep=1, use_cache=False)
            p = len(r["prompt_ids"])
            out.append(captured["h"][0, p - 1 : len(ids) - 1].float().clone())
            if progress is not None:
                progress(1)
    finally:
        hook.remove()
    return out


def frequent_tokens(records: list[dict], count: int, always: tuple[int, ...] = ()) -> torch.Tensor:
    """The `count` most frequent answer tokens (plus `always`, e.g. EOS), sorted by id."""
    counts = Counter(t for r in records for t in r["answer_ids"])
    kept = set(always) | {t for t, _ in counts.most_common(max(0, count - len(always)))}
    return torch.tensor(sorted(kept))


class Windows:
    """All (record, start) pairs with `depth` steps left, gathered into tensors per batch."""

    def __init__(self, feats: list[torch.Tensor], records: list[dict], token_index: torch.Tensor, depth: int):
        self.depth = depth
        self.F = torch.cat(feats)
        self.tokens = torch.tensor([t for r in records for t in r["answer_ids"]])
        self.labels = token_index[self.tokens]
        starts, offset = [], 0
        for r in records:
            n = len(r["answer_ids"])
            starts += range(offset, offset + n - depth)
            offset += n
        self.starts = torch.tensor(starts, dtype=torch.long)

    def batch(self, idx: torch.Tensor):
        steps = idx[:, None] + torch.arange(self.depth)
        return self.F[idx], self.tokens[steps], self.labels[steps + 1], self.F[steps + 1]


def unroll(head: DraftHead, f0: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Predicted features after each of tokens[:, j], each step fed the previous prediction."""
    preds, f = [], f0
    for j in range(tokens.shape[1]):
        f = head.step(f, tokens[:, j])
        preds.append(f)
    return preds


def train_head(
    model,
    records: list[dict],
    cfg: HeadTrainConfig,
    target_name: str,
    eos_ids=(),
    log=print,
    feats: list[torch.Tensor] | None = None,
    init: DraftHead | None = None,
) -> tuple[DraftHead, dict]:
    """Train on 1 - val_share of the records; return the head and a summary with held-out acceptance. With `init`
    (a trained head of this target) training continues from its weights and keeps its vocabulary."""
    torch.manual_seed(cfg.seed)
    order = list(range(len(records)))
    random.Random(cfg.seed).shuffle(order)
    n_val = max(1, int(len(records) * cfg.val_share))
    feats = feats if feats is not None else features(model, records)
    vocab_ids = init.vocab_ids if init is not None else frequent_tokens(records, cfg.vocab, tuple(eos_ids))
    token_index = torch.full((model.get_output_embeddings().weight.shape[0],), IGNORE, dtype=torch.long)
    token_index[vocab_ids] = torch.arange(len(vocab_ids))
    split = {
        name: [order[i] for i in part] for name, part in (("val", range(n_val)), ("train", range(n_val, len(order))))
    }
    data = {
        name: Windows([feats[i] for i in idx], [records[i] for i in idx], token_index, cfg.depth)
        for name, idx in split.items()
    }
    config = HeadConfig(
        hidden_size=feats[0].shape[1],
        intermediate_size=init.config.intermediate_size if init is not None else cfg.intermediate,
        target_vocab_size=len(token_index),
        target=target_name,
    )
    head = DraftHead(config, vocab_ids)
    if init is not None:
        head.load_state_dict(init.state_dict())  # copied into the new head's fp32 parameters
    head.attach(model)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.0)
    train = data["train"]
    steps = cfg.epochs * math.ceil(len(train.starts) / cfg.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    scale = train.F.pow(2).mean()
    start, step = time.time(), 0
    for epoch in range(cfg.epochs):
        head.train()
        for idx in train.starts[torch.randperm(len(train.starts))].split(cfg.batch_size):
            f0, tokens, labels, targets = train.batch(idx)
            loss = 0.0
            for j, pred in enumerate(unroll(head, f0, tokens)):
                loss = loss + nn.functional.cross_entropy(head.logits(pred), labels[:, j], ignore_index=IGNORE)
                loss = loss + cfg.reg_weight * nn.functional.mse_loss(pred, targets[:, j]) / scale
            opt.zero_grad(set_to_none=True)
            (loss / cfg.depth).backward()
            opt.step()
            sched.step()
            step += 1
            if step % 100 == 0:
                log(f"step {step}/{steps}  loss {loss.item() / cfg.depth:.3f}  {time.time() - start:.0f}s")
        log(f"epoch {epoch + 1}: held-out {evaluate(head, data['val'])}")
    summary = {
        "train_seconds": round(time.time() - start, 1),
        "train_windows": len(train.starts),
        "val_records": n_val,
        "val": evaluate(head, data["val"]),
        **vars(cfg),
        "vocab": len(vocab_ids),  # the head's, not the setting (an init head brings its own, as do small datasets)
        "intermediate": config.intermediate_size,
    }
    return head.eval(), summary


@torch.inference_mode()
def evaluate(head: DraftHead, data: Windows) -> dict:
    """Top-1 agreement with the target at each unrolled step, and the mean accepted length of a depth-long chain."""
    head.eval()
    hits = []
    for idx in data.starts.split(1024):
        f0, tokens, labels, _ = data.batch(idx)
        hits.append(
            torch.stack([head.logits(p).argmax(-1) == labels[:, j] for j, p in enumerate(unroll(head, f0, tokens))], 1)
        )
    hit = torch.cat(hits).float()
    return {
        "top1_per_step": [round(v, 3) for v in hit.mean(0).tolist()],
        "mean_accepted": round(hit.cumprod(1).sum(1).mean().item(), 3),
    }
