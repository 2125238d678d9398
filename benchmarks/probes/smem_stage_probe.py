"""Shared memory for the CUDA kernel's staged activations: the table config and a few others at M = 8, 16, 32
with 32, 64 and 128 KiB per block (``weight_mma.STAGE_BYTES``), and whether the bits change (they must not).

    python benchmarks/probes/smem_stage_probe.py   (writes $OUT/smem_probe.json or ./smem_probe.json)
"""
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from nvfp4_linear import graph_time, random_nvfp4  # noqa: E402

from anyfp4.kernels.cuda import weight_mma  # noqa: E402
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated  # noqa: E402
from anyfp4.dispatch.tuning import mma_config  # noqa: E402
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.kernels.cuda.weight_mma import nvfp4_mma_gemm  # noqa: E402
dev = torch.device("cuda", 0)
sms = torch.cuda.get_device_properties(0).multi_processor_count
out = []
CAPS = [32 * 1024, 64 * 1024, 128 * 1024]
for (n, k, gated) in [(14336, 4096, False), (4096, 14336, False), (28672, 8192, False), (14336, 4096, True)]:
    nbytes = n * k * 0.5625 * (2 if gated else 1)
    copies = max(2, int(512 * 2**20 // nbytes) + 1)
    if gated:
        ws = []
        for _ in range(copies):
            g, u = random_nvfp4(n, k, dev), random_nvfp4(n, k, dev)
            u = type(u)(u.packed, u.block_scale, g.global_scale)
            ws.append(prepack_nvfp4_gated(g, u, dev))
    else:
        ws = [prepack_nvfp4(random_nvfp4(n, k, dev), dev) for _ in range(copies)]
    for m in (8, 16, 32):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        table = mma_config(90, sms, "nvfp4", gated, n, k, ws[0].codes.shape[1] * 8, m)
        cfgs = [table] + [MMAConfig(1, w, s, d) for w, s, d in [(8, 1, 4), (8, 2, 4), (8, 4, 2), (4, 8, 2), (8, 2, 2), (8, 1, 2)]]
        row = {"shape": [n, k], "gated": gated, "m": m, "table": str(table)}
        ref = None
        for cap in CAPS:
            weight_mma.STAGE_BYTES = cap
            y = nvfp4_mma_gemm(x, ws[0], None, table)
            if ref is None:
                ref = y.clone()
            same = torch.equal(y, ref)
            best = min(((graph_time(lambda i: nvfp4_mma_gemm(x, ws[i % len(ws)], None, c)), str(c)) for c in cfgs), key=lambda z: z[0])
            tt = graph_time(lambda i: nvfp4_mma_gemm(x, ws[i % len(ws)], None, table))
            row[str(cap)] = {"table_us": tt * 1e6, "best_us": best[0] * 1e6, "best": best[1], "same_bits": same}
            print(f"{'gated ' if gated else ''}{n}x{k} M={m} cap {cap//1024}K: table {tt*1e6:.1f} us best {best[0]*1e6:.1f} {best[1]} same={same}", flush=True)
        out.append(row)
    del ws
    torch.cuda.empty_cache()
    Path(os.environ.get("OUT", "."), "smem_probe.json").write_text(json.dumps(out, indent=1))
