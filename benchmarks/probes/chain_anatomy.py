"""Where the time of a chain of CUDA decode kernels goes (M = 1): each variant times 20 back-to-back calls over
rotated weight copies in one CUDA graph (``bench.timing.graph_seconds``), as a decode step runs them, with the
kernel's source changed for the measurement only:

- ``base``: the source as served, early launch on (``EARLY=1``), and ``no_early`` (EARLY=0);
- ``no_wait``: without ``griddepcontrol.wait``, so that consecutive kernels run wholly at the same time (what the
  chain would cost if nothing waited for the previous kernel; split-K counters race, so it runs split 1 only and
  its outputs are not looked at);
- ``no_stage``: the activations not staged (no copies, no barriers; the mmas read whatever shared memory holds);
- ``min_blocks3`` / ``4``: registers capped (``__launch_bounds__``) so that 3 / 4 blocks fit a multiprocessor;
- ``no_decode``: NVFP4 code words fed to the mmas undecoded (no decode, no block scales: the instructions of a step
  but its loads and mmas), and with ``no_stage`` too;
- ``no_mma``: the decoded halves and the activations folded into the sums by one integer xor and one add instead of
  the two mmas of a word (the decode and loads kept, the tensor-core chain gone);
- for scale, bf16 ``F.linear`` over a weight of the same bytes, and a device copy of half those bytes each way.

    PYTHONPATH=src python benchmarks/probes/chain_anatomy.py --out chain_anatomy.json [--shapes 4096x4096 ...]
"""

from __future__ import annotations

import argparse
import json

import torch

from anyfp4.bench.random_weights import random_nvfp4
from anyfp4.bench.timing import ROTATE_BYTES, copy_bandwidth, graph_seconds
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.kernels.cuda import nvrtc, weight_mma
from anyfp4.kernels.device import device_arch
from anyfp4.kernels.cuda.counters import reserve_counters
from anyfp4.packing.nvfp4 import prepack_nvfp4

MIN_BLOCKS = (("min_blocks3", True), ("min_blocks4", True))
VARIANTS = (("base", True), ("no_early", False), ("no_wait", True), ("no_stage", True), ("no_decode", True),
            ("no_decode_no_stage", True), ("no_mma", True))
MMAS = ("mma_k16(MMA_ACC(a, b), ha[0], hb[0], ha[1], hb[1], bx[b].x, bx[b].y);\n"
        "                    mma_k16(MMA_ACC(a, b), ha[2], hb[2], ha[3], hb[3], bx[b].z, bx[b].w);")
NO_MMAS = ("MMA_ACC(a, b)[0] += __uint_as_float(((ha[0] ^ hb[0] ^ ha[1] ^ hb[1] ^ ha[2] ^ hb[2] ^ ha[3] ^ hb[3])"
           " ^ (bx[b].x ^ bx[b].y ^ bx[b].z ^ bx[b].w)) & 0x3f7fffffu);")
BOUNDS = "__launch_bounds__(WARPS * 32)"
WAIT = 'asm volatile("griddepcontrol.wait;" ::: "memory");'
STAGE = "auto stage = [&](const int s) {"
SKIP_STAGE = STAGE + " if (1) { round_beg = s; round_end = min(s + round_steps, s_end); return; }"


def variant_source(name: str) -> str:
    src = weight_mma.source_text()
    if name == "no_wait":
        assert src.count(WAIT) == 1, "the source's griddepcontrol.wait moved"
        return src.replace(WAIT, "")
    if name.startswith("min_blocks"):  # registers capped for that many resident blocks of a multiprocessor
        assert src.count(BOUNDS) == 1, "the source's launch bounds moved"
        return src.replace(BOUNDS, f"__launch_bounds__(WARPS * 32, {name[-1]})")
    if "no_decode" in name:  # NVFP4: each weight word goes to the mma as it is (no decode, no scale)
        for p in ("a", "b"):
            line = f"h{p}[p] = mul2(decode_pair(v{p}, p), bs{p});"
            assert src.count(line) == 1, "the source's decode moved"
            src = src.replace(line, f"h{p}[p] = v{p} ^ (u32)p;")
    if name == "no_mma":
        assert src.count(MMAS) == 1, "the source's mmas moved"
        src = src.replace(MMAS, NO_MMAS)
    if "no_stage" in name:
        assert src.count(STAGE) == 1, "the source's stage lambda moved"
        src = src.replace(STAGE, SKIP_STAGE)
    return src


def chain_us(source: str, early: bool, cfg: MMAConfig, ps: list, x: torch.Tensor, device: int) -> float:
    counters = reserve_counters(x.device)
    sm = device_arch(device)[0]
    stage_bytes = min(weight_mma.STAGE_BYTES, nvrtc.max_shared_memory(device) - 1024)
    plans = [weight_mma.plan_launch("nvfp4", x, p.codes, p.scales, p.global_scale, None, p.out_features, 0, cfg,
                                    None, None, stage_bytes=stage_bytes, early=early, counters=counters, sm=sm)
             for p in ps]
    kernel = nvrtc.load(source, weight_mma.KERNEL, plans[0].defines, device, shared_memory=stage_bytes)

    def call(i):
        plan = plans[i % len(plans)]
        kernel.launch(plan.grid, plan.threads, plan.shared_bytes, plan.args, early=early)

    return graph_seconds(call) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="chain_anatomy.json")
    ap.add_argument("--shapes", nargs="+", default=["4096x4096", "6144x4096", "14336x4096", "4096x14336"])
    args = ap.parse_args()
    dev = torch.device("cuda")
    device = torch.cuda.current_device()
    copy_Bps = copy_bandwidth(dev)
    rows = []
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        nbytes = n * k * 9 // 16
        copies = max(2, min(20, ROTATE_BYTES // nbytes))
        ps = [prepack_nvfp4(random_nvfp4(n, k, dev)) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        steps = k // 128
        table = weight_mma_table_config(device, n, k)
        configs = {"table": table, "split1_kw8": MMAConfig(mt=1, warps=8, split_k=1, depth=2, kw=8),
                   "mt1_split4_kw2": MMAConfig(mt=1, warps=8, split_k=4, depth=2, kw=2),
                   "mt1_split2_kw4": MMAConfig(mt=1, warps=8, split_k=2, depth=2, kw=4),
                   "mt1_split8": MMAConfig(mt=1, warps=8, split_k=8, depth=2),
                   "mt1_split2_kw2_d4": MMAConfig(mt=1, warps=8, split_k=2, depth=4, kw=2)}
        for cname, cfg in configs.items():
            if steps % (cfg.split_k * cfg.kw):
                continue
            for vname, early in (VARIANTS if cname in ("table", "split1_kw8") else VARIANTS[:1]) + MIN_BLOCKS:
                if vname == "no_wait" and cfg.split_k > 1:
                    continue
                us = chain_us(variant_source(vname), early, cfg, ps, x, device)
                row = {"n": n, "k": k, "config": cname, "cfg": cfg.__dict__, "variant": vname, "us": us,
                       "pct_copy": nbytes / (us * 1e-6) / copy_Bps * 100}
                rows.append(row)
                print(json.dumps(row), flush=True)
        kb = nbytes // 2 // k  # bf16 rows of the same bytes
        wb = [torch.randn(kb, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        rows.append({"n": kb, "k": k, "variant": "bf16_linear_same_bytes",
                     "us": graph_seconds(lambda i: torch.nn.functional.linear(x, wb[i % copies])) * 1e6})
        src = [torch.empty(nbytes // 2, dtype=torch.uint8, device=dev) for _ in range(copies)]
        dst = [torch.empty_like(s) for s in src]
        rows.append({"n": n, "k": k, "variant": "copy_half_bytes_each_way",
                     "us": graph_seconds(lambda i: dst[i % copies].copy_(src[i % copies])) * 1e6})
        print(json.dumps(rows[-2]), json.dumps(rows[-1]), flush=True)
        del ps, wb, src, dst
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "copy_bandwidth_Bps": copy_Bps, "rows": rows}, f, indent=1)


def weight_mma_table_config(device: int, n: int, k: int) -> MMAConfig:
    from anyfp4.dispatch.tuning import mma_config

    sm, sms = device_arch(device)
    return mma_config(sm, sms, "nvfp4", False, n, k, k, 1)


if __name__ == "__main__":
    main()
