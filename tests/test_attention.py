"""leapdecode's attention: a fresh prefill runs torch's causal kernel, which gives what the explicit causal mask
gives; rows after a past keep the explicit mask (torch's is_causal aligns rows to the first key, not the last)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from leapdecode.attention import causal_mask, grouped_sdpa


@pytest.mark.parametrize("n", [2, 17, 300])
def test_a_fresh_prefill_equals_the_masked_attention(n):
    torch.manual_seed(n)
    q, k, v = torch.randn(1, 6, n, 32), torch.randn(1, 2, n, 32), torch.randn(1, 2, n, 32)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(n, n), enable_gqa=True)
    torch.testing.assert_close(grouped_sdpa(q, k, v), masked, rtol=1e-5, atol=1e-6)


def test_rows_after_a_past_see_the_past_and_themselves_only():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 4, 10, 16), torch.randn(1, 4, 10, 16)
    out = grouped_sdpa(q, k, v)
    for i in range(3):  # row i (position 7 + i) attends keys 0 .. 7 + i
        alone = F.scaled_dot_product_attention(q[:, :, i : i + 1], k[:, :, : 8 + i], v[:, :, : 8 + i])
        torch.testing.assert_close(out[:, :, i : i + 1], alone, rtol=1e-5, atol=1e-6)
