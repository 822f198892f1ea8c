"""Draft length control: grow k while drafts are fully accepted, shrink it after early rejections."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import require


@dataclass
class DraftLengthController:
    """Additive increase on full acceptance, fall back towards the accepted length on rejection.

    With `adaptive=False`, k stays fixed at k_init.
    """

    k_init: int = 4
    k_min: int = 1
    k_max: int = 16
    adaptive: bool = True

    def __post_init__(self) -> None:
        require(1 <= self.k_min <= self.k_init <= self.k_max,
                f"draft length needs 1 <= k_min <= k <= k_max, got {self.k_min}, {self.k_init}, {self.k_max}")
        self.k = self.k_init

    def next_k(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        if not self.adaptive or proposed == 0:
            return
        if accepted == proposed:
            self.k = min(self.k + 2, self.k_max)
        else:
            self.k = max(self.k_min, min(self.k - 1, accepted + 1))
