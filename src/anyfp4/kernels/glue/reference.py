"""The pure-torch definitions of the runner's layer-glue kernels (``rms_norm``, ``rope_cache``): the ops'
CPU path and the Triton kernels' test oracles. Pure torch, so the CPU path runs without Triton installed.
"""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension: ``weight * x / sqrt(mean(x^2) + eps)`` in float32, rounded once to x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf).to(x.dtype)


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, rms_norm(h)) for h = x + delta rounded to x's dtype."""
    h = x + delta
    return h, rms_norm_reference(h, weight, eps)


def rope_cache_reference(q, k, v, cos, sin, k_cache, v_cache, input_pos, norms=None):
    """q (b, t, h, hd), k/v (b, t, kvh, hd), cos/sin (b or 1, t, rd) float32, rd <= hd -> q rotated (b, t, h, hd);
    k rotated and v written to the caches (b, kvh, S, hd) at slots ``input_pos``. The first rd dims of a head
    are rotated (partial rotary when rd < hd), the rest pass through. ``norms`` (q weight, k weight, eps): each q / k
    head RMSNormed (``rms_norm_reference``) first."""
    rd = cos.shape[-1]
    if norms is not None:
        q, k = rms_norm_reference(q, norms[0], norms[2]), rms_norm_reference(k, norms[1], norms[2])

    def rot(x):
        xf = x.float()
        inner, rest = xf[..., :rd], xf[..., rd:]
        half = rd // 2
        rh = torch.cat((-inner[..., half:], inner[..., :half]), dim=-1)
        return torch.cat((inner * cos[:, :, None] + rh * sin[:, :, None], rest), dim=-1)

    q_out = rot(q).to(k_cache.dtype)
    k_cache.index_copy_(2, input_pos, rot(k).to(k_cache.dtype).transpose(1, 2))
    v_cache.index_copy_(2, input_pos, v.to(v_cache.dtype).transpose(1, 2))
    return q_out
