"""What bandwidth the decode kernel's way of reading an NVFP4 prepack allows, apart from its decode and mmas: kernels
that read a prepack's bytes exactly as ``weight_mma.cu`` reads them at M = 1 (a warp per 16-row tile, per 128-k step
two 16-byte code loads and one 4-byte scale load a lane, a ring of DEPTH steps in registers, split-K over blocks)
and only fold the words into one value, with WORK dependent integer operations per step standing in for the decode;
beside them the same bytes read by a grid-stride loop (every warp's loads side by side, as a copy reads). Times are
per call over CUDA-graph replays of rotated copies, without early launch.

    PYTHONPATH=src python benchmarks/probes/stream_pattern.py --out stream_pattern.json [--shapes 28672x8192 ...]

If the tile reads with no work reach the grid-stride rate, the access pattern is not what holds the kernel back;
the depth and work columns then say whether bytes in flight or issued instructions do.
"""

from __future__ import annotations

import argparse
import json

import torch

from anyfp4.bench.timing import ROTATE_BYTES, copy_bandwidth, graph_seconds
from anyfp4.kernels.cuda import nvrtc

SOURCE = r"""
typedef unsigned int u32;
#ifdef DEPTH
extern "C" __global__ void __launch_bounds__(WARPS * 32) tile_reads(const uint4* __restrict__ codes,
        const u32* __restrict__ scales, int nsteps, int stride_c4, int stride_s4, u32* __restrict__ out) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int tile = blockIdx.x * WARPS + warp, split = gridDim.y, z = blockIdx.y;
    const int s_beg = z * nsteps / split, s_end = (z + 1) * nsteps / split;
    const uint4* c = codes + (long long)tile * 16 * stride_c4 + lane;
    const u32* sc = scales + (long long)tile * 16 * stride_s4 + lane;
    uint4 wa[DEPTH], wb[DEPTH];
    u32 sw[DEPTH];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d)
        if (s_beg + d < s_end) {
            wa[d] = c[(s_beg + d) * 64]; wb[d] = c[(s_beg + d) * 64 + 32]; sw[d] = sc[(s_beg + d) * 32];
        }
    u32 acc = 0;
    for (int s0 = s_beg; s0 < s_end; s0 += DEPTH) {
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) {
            if (s0 + d < s_end) {
                u32 v = wa[d].x ^ wa[d].y ^ wa[d].z ^ wa[d].w ^ wb[d].x ^ wb[d].y ^ wb[d].z ^ wb[d].w ^ sw[d];
#pragma unroll
                for (int i = 0; i < WORK; ++i) v = v * 0x9E3779B1u + (v >> 7);  // dependent work on the words
                acc += v;
                const int s = s0 + d + DEPTH;
                if (s < s_end) { wa[d] = c[s * 64]; wb[d] = c[s * 64 + 32]; sw[d] = sc[s * 32]; }
            }
        }
    }
    if (acc == 0x12345678u) out[0] = acc;  // keeps the loads
}
#else

extern "C" __global__ void __launch_bounds__(256) grid_reads(const uint4* __restrict__ w, int n16,
                                                             u32* __restrict__ out) {
    u32 acc = 0;
    const long long stride = (long long)gridDim.x * 256 * PER;
    for (long long base = blockIdx.x * 256LL * PER + threadIdx.x; base < n16; base += stride) {
        uint4 r[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) r[i] = base + i * 256 < n16 ? w[base + i * 256] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int i = 0; i < PER; ++i) acc ^= r[i].x ^ r[i].y ^ r[i].z ^ r[i].w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}
#endif
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["28672x8192", "34816x5120", "5120x17408"],
                    help="N x K (a gated layer: both halves, 2N)")
    ap.add_argument("--configs", nargs="+", default=["8:8:1", "8:16:1", "4:8:1", "4:4:4", "8:4:2", "8:2:16"],
                    help="warps:depth:split")
    ap.add_argument("--work", nargs="+", type=int, default=[0, 40])
    ap.add_argument("--commit", default="")
    ap.add_argument("--out", default="stream_pattern.json")
    args = ap.parse_args()
    device = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    report = {"gpu": torch.cuda.get_device_name(), "commit": args.commit,
              "copy_tbps": copy_bandwidth(torch.device("cuda")) / 1e12, "rows": []}
    print(f"copy {report['copy_tbps']:.2f} TB/s", flush=True)
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        nbytes = n * k // 2 + n * k // 16
        copies = max(2, ROTATE_BYTES // nbytes)
        codes = [torch.randint(0, 2**31, (n, k // 8), dtype=torch.int32, device="cuda") for _ in range(copies)]
        scales = [torch.randint(0, 2**31, (n, k // 64), dtype=torch.int32, device="cuda") for _ in range(copies)]
        for per in (8, 16):
            kern = nvrtc.load(SOURCE, "grid_reads", {"PER": per}, device)
            n16 = n * k // 32  # the codes' 16-byte words; the scales read alike would add 1/8
            us = graph_seconds(lambda i: kern.launch((sms * 4, 1, 1), 256, 0, [codes[i % copies], n16, out]),
                               reps=copies) * 1e6
            row = {"shape": shape, "kind": "grid", "per": per, "us": us, "tbps": n16 * 16 / us / 1e6}
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
        for cfg in args.configs:
            warps, depth, split = (int(v) for v in cfg.split(":"))
            for work in args.work:
                kern = nvrtc.load(SOURCE, "tile_reads", {"WARPS": warps, "DEPTH": depth, "WORK": work}, device)
                grid = (n // 16 // warps, split, 1)
                us = graph_seconds(lambda i: kern.launch(grid, warps * 32, 0, [codes[i % copies], scales[i % copies],
                                                                                k // 128, k // 32, k // 64, out]),
                                   reps=copies) * 1e6
                per_sm = kern.blocks_per_sm(warps * 32, 0)
                row = {"shape": shape, "kind": "tiles", "warps": warps, "depth": depth, "split": split, "work": work,
                       "blocks_per_sm": per_sm, "waves": grid[0] * split / (sms * per_sm), "us": us,
                       "tbps": nbytes / us / 1e6}
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
        codes = scales = None
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
