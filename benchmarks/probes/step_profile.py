"""Where one decode step's time goes: CUDA kernel time by kernel name, for one eager decode step of a
random-weight model (torch.profiler), next to the step's CUDA-graph replay time. Under torchrun the model
is split over the ranks (tensor parallelism) and rank 0 reports its own kernels.

    PYTHONPATH=src python benchmarks/probes/step_profile.py --arch llama-3.1-8b --formats nvfp4 bf16 \
        --out step_profile.json
    PYTHONPATH=src torchrun --nproc-per-node 2 benchmarks/probes/step_profile.py --formats nvfp4 \
        --out step_profile_tp2.json

2026-11-29, H200 (results/step_profile_llama8b_nvfp4_h200.json, ..._tp2_h200.json): random Llama-3.1-8B NVFP4
spends 2.28 of its 3.0 ms per step in the decode kernels (41% of copy bandwidth), the bf16 lm_head 0.26 ms,
attention 0.2 ms; on two ranks the 64 sums take 0.45 ms (benchmarks/NOTES.md).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import torch

from anyfp4.runtime.generate import cache_slots, decode_step
from anyfp4.bench.random_model import random_model


def kernel_table(run, reps: int = 5) -> list[dict]:
    """CUDA kernel time and launches of one ``run()`` (a step, or a prefill), by kernel name, averaged over
    ``reps`` runs, the costliest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    by_name = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name[e.name][0] += e.device_time_total / reps
            by_name[e.name][1] += 1
    rows = [{"kernel": k[:120], "us_per_step": v[0], "launches_per_step": v[1] / reps} for k, v in by_name.items()]
    return sorted(rows, key=lambda r: -r["us_per_step"])


def graph_ms(model, tok, pos, reps: int = 50) -> float:
    step = decode_step(model)
    for _ in range(3):
        step(tok, pos)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        step(tok, pos)
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="llama-3.1-8b")
    p.add_argument("--formats", nargs="+", default=["nvfp4", "bf16"])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--out", default="step_profile.json")
    a = p.parse_args()
    rank, tp = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if tp > 1:
        from anyfp4.parallel.ranks import init_process_group

        init_process_group(rank, tp, "cuda", int(os.environ.get("MASTER_PORT", 29500)))
    dev = torch.device("cuda", rank)
    report = {"gpu": torch.cuda.get_device_name(), "arch": a.arch, "context": a.context, "tp": tp, "formats": {}}
    for fmt in a.formats:
        model = random_model(a.arch, fmt, dev, torch.bfloat16, progress=False, rank=rank, tp=tp)
        model.setup_caches(1, cache_slots(model, a.context, 64))
        tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
        pos = torch.tensor([a.context], device=dev)
        model(tok, pos)
        rows = kernel_table(lambda: model(tok, pos))
        total = sum(r["us_per_step"] for r in rows)
        g = graph_ms(model, tok, pos)
        report["formats"][fmt] = {"graph_ms_per_step": g, "kernel_us_per_step": total,
                                  "launches_per_step": sum(r["launches_per_step"] for r in rows), "kernels": rows}
        if rank:
            continue
        print(f"== {fmt}: graph replay {g:.3f} ms/step; kernels {total / 1e3:.3f} ms in "
              f"{report['formats'][fmt]['launches_per_step']:.0f} launches")
        for r in rows[:14]:
            print(f"  {r['us_per_step']:8.1f} us  x{r['launches_per_step']:5.0f}  {r['kernel'][:90]}")
        del model
        torch.cuda.empty_cache()
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    if tp > 1:
        import torch.distributed as dist

        dist.barrier()
        os._exit(0)  # graphs holding peer-memory kernels: leave without tearing down NCCL under them


if __name__ == "__main__":
    main()
