"""A draft head in the spirit of EAGLE (Li et al. 2024): predict the target's next *feature* from its current one.

The target's last hidden state (after its final norm) already summarises the whole context, and its output head turns
it into the next token. The head learns f_{t+1} ≈ head(f_t, embed(x_{t+1})) from the target's own greedy answers, so
drafting k tokens costs k passes through a ~3M-parameter MLP and a slice of the output head restricted to the tokens
the target actually emits — a few percent of one target forward each — instead of k forwards of a draft model.
Unlike EAGLE the head has no attention of its own: the feature is its only memory, which keeps it cache-free.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import asdict, dataclass

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import LeapDecodeError

CHECKPOINT_DIR = pathlib.Path(__file__).parent / "checkpoints"


@dataclass
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    target_vocab_size: int
    target: str  # the short name of the model it was trained on
    eps: float = 1e-5


class DraftHead(nn.Module):
    """f_next = z + mlp(norm(z)), z = fuse([f, norm(embed(x))]); logits over `vocab_ids` through the target's head."""

    def __init__(self, config: HeadConfig, vocab_ids: torch.Tensor):
        super().__init__()
        d, inner = config.hidden_size, config.intermediate_size
        self.config = config
        self.fuse = nn.Linear(2 * d, d, bias=False)
        self.embed_norm = nn.RMSNorm(d, eps=config.eps)
        self.mlp_norm = nn.RMSNorm(d, eps=config.eps)
        self.gate = nn.Linear(d, inner, bias=False)
        self.up = nn.Linear(d, inner, bias=False)
        self.down = nn.Linear(inner, d, bias=False)
        self.register_buffer("vocab_ids", vocab_ids.long(), persistent=True)
        # borrowed from the target by attach(): plain tensors, so neither trained nor saved
        self.embed_weight: torch.Tensor | None = None
        self.out_weight: torch.Tensor | None = None
        self.full_out_weight: torch.Tensor | None = None
        self.out_linear: nn.Module | None = None  # the output-head slice as a module (heads.precision)
        self.native_step = None  # step and logits in one native call (heads.precision.q8_head), where it applies
        self.meta: dict = {}  # head.json of a loaded checkpoint (training summary)

    def attach(self, target: nn.Module) -> "DraftHead":
        """Share the target's input embedding and the rows of its output head for `vocab_ids`."""
        embed, out = target.get_input_embeddings(), target.get_output_embeddings()
        if embed.weight.shape[1] != self.config.hidden_size or out.weight.shape[0] != self.config.target_vocab_size:
            raise LeapDecodeError(
                f"draft head was trained for {self.config.target} (hidden {self.config.hidden_size}, vocabulary "
                f"{self.config.target_vocab_size}); this target has hidden {embed.weight.shape[1]}, vocabulary "
                f"{out.weight.shape[0]}"
            )
        self.embed_weight = embed.weight.detach()
        self.full_out_weight = out.weight.detach()
        self.out_weight = out.weight.detach()[self.vocab_ids].to(self.fuse.weight.dtype).contiguous()
        self.vocab_list = self.vocab_ids.tolist()  # read per draft token: a list index, not a tensor index
        return self

    def step(self, feature: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """Predicted feature after `token`, given the feature at the position before it. Shapes [..., d], [...]."""
        x = self.embed_norm(nn.functional.embedding(token, self.embed_weight).to(self.embed_norm.weight.dtype))
        z = self.fuse(torch.cat([feature.to(x.dtype), x], -1))
        h = self.mlp_norm(z)
        return z + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """Logits over vocab_ids (index i is token vocab_ids[i])."""
        if self.out_linear is not None:
            return self.out_linear(feature)
        return feature @ self.out_weight.T

    def draft_step(self, feature: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(`step`, then `logits` of it) for features [rows, d] and tokens [rows]: the route drafting takes."""
        if self.native_step is not None:
            return self.native_step(feature, token)
        feature = self.step(feature, token)
        return feature, self.logits(feature)

    @property
    def precision(self) -> str:
        """What its products run in: "int8" or "q8" (heads.precision), else its parameters' dtype."""
        if self.out_linear is not None:
            return self.meta.get("precision", "int8")
        return str(self.embed_norm.weight.dtype).removeprefix("torch.")

    def size(self) -> int:
        """Its own weights (the borrowed output-head slice not counted), whatever precision holds them."""
        return sum(
            layer.in_features * layer.out_features for layer in (self.fuse, self.gate, self.up, self.down)
        ) + sum(norm.weight.numel() for norm in (self.embed_norm, self.mlp_norm))

    def rows(self, token_ids: list[int]) -> torch.Tensor:
        """The target's output-head rows of any tokens (to score tokens outside vocab_ids, e.g. the prompt's)."""
        return self.full_out_weight[token_ids].to(self.out_weight.dtype)

    def save(self, directory: pathlib.Path, extra: dict | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(torch.bfloat16) if v.is_floating_point() else v for k, v in self.state_dict().items()}
        save_file(state, str(directory / "head.safetensors"))
        (directory / "head.json").write_text(json.dumps({"config": asdict(self.config), **(extra or {})}, indent=1))


def shipped_head_name(target: str | pathlib.Path) -> str | None:
    """The short name of the head shipped for `target`, else None: a packaged model's name, or the path of its cached
    copy (its manifest names the package, with that package's checksum: bench-serve and scripts load it so). Other
    paths and hub ids never match."""
    from ..models.registry import packaged_name

    name = str(target)
    if name and pathlib.Path(name).name != name:
        name = packaged_name(pathlib.Path(name).expanduser()) or ""
    return name if name and (CHECKPOINT_DIR / name / "head.json").exists() else None


def has_shipped_head(target: str | pathlib.Path) -> bool:
    return shipped_head_name(target) is not None


def load_head(source: str | pathlib.Path, dtype: torch.dtype = torch.float32) -> DraftHead:
    """A trained head from a directory, or by the short name of its target among the shipped checkpoints."""
    directory = pathlib.Path(source)
    if not (directory / "head.json").exists():
        directory = CHECKPOINT_DIR / (shipped_head_name(source) or str(source))
    if not (directory / "head.json").exists():
        shipped = sorted(p.name for p in CHECKPOINT_DIR.glob("*") if (p / "head.json").exists())
        raise LeapDecodeError(
            f"no trained draft head for '{source}' (shipped: {', '.join(shipped) or 'none'}); train one with "
            f"`leapdecode heads train --model {source} --out DIR` and pass --head DIR"
        )
    meta = json.loads((directory / "head.json").read_text())
    state = load_file(str(directory / "head.safetensors"))
    head = DraftHead(HeadConfig(**meta["config"]), state["vocab_ids"])
    head.load_state_dict(state)
    head.meta = meta
    return head.to(dtype).eval()
