"""The one thing decoders need from a diffusion LM: tokens in, logits out.

```python
class DiffusionLM(Protocol):
    mask_token_id: int; eos_token_id: int; pad_token_id: int; max_length: int
    def logits(self, canvas: LongTensor) -> FloatTensor   # [batch, length] -> [batch, length, vocab]
    def prefill(self, canvas, upto) -> None                # optional: cache keys/values of canvas[:, :upto]
```

`logits` sees the whole canvas (prompt + partly masked answer) with bidirectional attention and returns logits for
every position. `prefill` is optional KV reuse (Fast-dLLM's approximate prefix cache): the decode loop calls it when a
semi-autoregressive block starts, and an adapter that implements it may then compute `logits` for the suffix only.
Adapters that do not cache simply leave it a no-op; the loop's results do not depend on it beyond the approximation.

Plugging in LLaDA-8B or Dream-7B from a local directory (``trust_remote_code`` checkpoints):

```python
from transformers import AutoModel, AutoTokenizer
from leapdecode.diffusion.interface import HFMaskedLM
model = AutoModel.from_pretrained("/models/LLaDA-8B-Instruct", trust_remote_code=True, torch_dtype="bfloat16")
tok = AutoTokenizer.from_pretrained("/models/LLaDA-8B-Instruct", trust_remote_code=True)
lm = HFMaskedLM(model, mask_token_id=126336, eos_token_id=126081, pad_token_id=126081, max_length=4096)
# Dream-7B: mask_token_id=tok.mask_token_id, eos/pad = tok.eos_token_id / tok.pad_token_id, and shift_logits=True
# (Dream predicts token i from position i-1, so its logits are shifted right by one).
```
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .model import MaskedDiffusionLM


@runtime_checkable
class DiffusionLM(Protocol):
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    max_length: int

    def logits(self, canvas: torch.LongTensor) -> torch.Tensor: ...

    def prefill(self, canvas: torch.LongTensor, upto: int) -> None: ...


class HFMaskedLM:
    """Adapter for any transformers model whose forward(input_ids) returns `.logits` (or a tensor) over the canvas:
    the shipped `MaskedDiffusionLM`, LLaDA (`GSAI-ML/LLaDA-8B-*`) and Dream (`Dream-org/Dream-v0-*`, with
    `shift_logits=True`) loaded from a local directory."""

    def __init__(
        self,
        model: torch.nn.Module,
        mask_token_id: int,
        eos_token_id: int,
        pad_token_id: int,
        max_length: int,
        shift_logits: bool = False,
    ) -> None:
        self.model, self.shift_logits = model, shift_logits
        self.mask_token_id, self.eos_token_id, self.pad_token_id = mask_token_id, eos_token_id, pad_token_id
        self.max_length = max_length

    @torch.no_grad()
    def logits(self, canvas: torch.LongTensor) -> torch.Tensor:
        out = self.model(canvas)
        logits = out if isinstance(out, torch.Tensor) else out.logits
        if self.shift_logits:  # Dream: logits at i-1 predict token i
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits.float()

    def prefill(self, canvas: torch.LongTensor, upto: int) -> None:
        """No KV reuse in this adapter: every step recomputes the full canvas (exact)."""


def wrap_shipped(model: MaskedDiffusionLM) -> HFMaskedLM:
    cfg = model.config
    return HFMaskedLM(model, cfg.mask_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.max_position_embeddings)
