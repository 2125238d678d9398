"""The CUDA decode kernel's correctness checks, shared by its GPU tests (test_weight_mma.py) and its host-emulated
CPU tests (test_weight_mma_host.py): any callable with ``nvfp4_mma_gemm``'s arguments against float64."""

import itertools

import torch

from anyfp4.formats.nvfp4 import NVFP4Weight
from anyfp4.dispatch.configs import MMAConfig

CONFIGS = [MMAConfig(1, 8, 1, 2), MMAConfig(1, 4, 3, 4), MMAConfig(2, 4, 5, 2), MMAConfig(1, 8, 8, 8),
           MMAConfig(4, 2, 3, 2)]


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def nvfp4_weight(n, k, gen, gs, device="cuda"):
    return NVFP4Weight(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device, generator=gen),
                       torch.randint(0, 0x7F, (n, k // 16), dtype=torch.uint8, device=device, generator=gen).view(
                           torch.float8_e4m3fn), gs)


def sweep_cases(ms, configs=CONFIGS):
    """(M, config) pairs of the families the launch sweep times."""
    return [(m, c) for m, c in itertools.product(ms, configs)
            if not ((c.mt == 2 and m > 16) or (c.mt == 4 and m <= 8))]


def strided_rows(x: torch.Tensor, pad: int = 24) -> torch.Tensor:
    """x as a view into rows ``pad`` wider, the gap NaN: a kernel reading past K or mixing rows shows it."""
    buf = torch.full((x.shape[0], x.shape[1] + pad), float("nan"), dtype=x.dtype, device=x.device)
    buf[:, : x.shape[1]] = x
    return buf[:, : x.shape[1]]


def check_kernel(kernel, p, pg, wd, gd, ud, bias, cases, gen):
    """``kernel`` against the float64 reference for each (M, config): NaN-poisoned outputs all written, plain +
    bias, strided activations, determinism, float32 output before the scale, and the gated prepack ``pg``
    (gate ``gd``, up ``ud``)."""
    dtype, (n, k), dev = bias.dtype, wd.shape, bias.device
    tol = 5e-4 if dtype == torch.float16 else 4e-3
    for m, cfg in cases:
        x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
        out = torch.full((m, n), float("nan"), dtype=dtype, device=dev)
        y = kernel(strided_rows(x), p, bias, cfg, out=out)
        assert not torch.isnan(y).any(), (m, cfg)
        assert rel_err(y, x.double() @ wd.t() + bias.double()) < tol, (m, cfg)
        assert torch.equal(y, kernel(x, p, bias, cfg)), "not deterministic"
        out32 = torch.full((m, n), float("nan"), dtype=torch.float32, device=dev)
        y32 = kernel(x, p, None, cfg, out=out32, out_dtype=torch.float32)
        scale = p.global_scale if hasattr(p, "global_scale") else p.scales[:n]
        assert not torch.isnan(y32).any(), (m, cfg)
        assert torch.equal((y32 * scale).to(dtype), kernel(x, p, None, cfg)), "float32 output is not the sum before scaling"
        yg = kernel(x, pg, None, MMAConfig(1, cfg.warps, cfg.split_k, min(cfg.depth, 4)))
        gref = torch.nn.functional.silu(x.double() @ gd.t()) * (x.double() @ ud.t())
        assert rel_err(yg, gref) < 2 * tol, (m, cfg)
