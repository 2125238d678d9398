"""The floor of a chain of dependent kernels on this GPU, whatever they compute: 20 launches in one CUDA graph, each
reading a value the previous one wrote, by kernels that only stream a weight's bytes (``PER`` 16-byte loads a
thread, all issued before ``griddepcontrol.wait`` when launched early) and write one value per block. Per-call
time against the bytes read says what a decode kernel of that size could reach at best under a dependency chain,
with early launch and without.

    PYTHONPATH=src python benchmarks/probes/chain_floor.py --out chain_floor.json

2026-12-02, H200 (results/chain_floor_h200.json): an empty dependent kernel 1.1 us a call early-launched (1.4
without); 9 MiB (a 4096x4096 NVFP4 weight) 2.65 us early-launched with 16 loads a thread (4.4 without), 14 MiB
3.8 us, 33 MiB 8.1 us (4.3 TB/s): a decode kernel's chain could be ~3x faster on the small layers.
"""

from __future__ import annotations

import argparse
import json

import torch

from anyfp4.bench.timing import ROTATE_BYTES, graph_seconds
from anyfp4.kernels.cuda import nvrtc

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256) stream_chain(const uint4* __restrict__ w, int n16,
                                                              const float* __restrict__ xin, float* __restrict__ out) {
#if EARLY
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
#if PER > 0
    uint4 r[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const long long idx = tid + i * stride;
        r[i] = idx < n16 ? __ldcs(w + idx) : make_uint4(0u, 0u, 0u, 0u);
    }
#endif
#if EARLY
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if PER > 0
#pragma unroll
    for (int i = 0; i < PER; ++i) acc ^= r[i].x ^ r[i].y ^ r[i].z ^ r[i].w;
#endif
    const float v = xin[blockIdx.x & 63] + (float)(acc & 1u);
    if (threadIdx.x == 0) out[blockIdx.x & 63] = v;
}
"""


def chain_us(nbytes: int, per: int, early: bool, device: int) -> tuple[float, int]:
    threads = 256
    n16 = nbytes // 16
    blocks = max(1, -(-n16 // (threads * per))) if per else 132
    copies = max(2, min(20, ROTATE_BYTES // max(nbytes, 1)))
    ws = [torch.empty(max(n16, 1) * 16, dtype=torch.uint8, device="cuda").random_() for _ in range(copies)]
    bufs = [torch.zeros(64, device="cuda") for _ in range(2)]
    kernel = nvrtc.load(SOURCE, "stream_chain", {"EARLY": int(early), "PER": per}, device)

    def call(i):
        kernel.launch((blocks, 1, 1), threads, 0, [ws[i % copies], n16, bufs[i % 2], bufs[(i + 1) % 2]], early=early)

    return graph_seconds(call) * 1e6, blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="chain_floor.json")
    ap.add_argument("--mib", nargs="+", type=float, default=[0, 9, 14, 33])
    args = ap.parse_args()
    device = torch.cuda.current_device()
    rows = []
    for mib in args.mib:
        nbytes = int(mib * 2**20) // 16 * 16
        for per in ((0,) if nbytes == 0 else (4, 16, 32)):
            for early in (False, True):
                us, blocks = chain_us(nbytes, per, early, device)
                row = {"mib": mib, "per": per, "early": early, "blocks": blocks, "us": us,
                       "TBps": nbytes / (us * 1e-6) / 1e12}
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
