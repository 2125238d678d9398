"""Probe: where does the decode kernel's time go? Variants timed with CUDA graphs on rotated weights."""
import sys, statistics, json, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch, triton, triton.language as tl
from nvfp4_linear import graph_time, random_nvfp4
from anyfp4.packing.nvfp4 import prepack_nvfp4
from anyfp4.dispatch.configs import DecodeConfig
from anyfp4.kernels.triton.nvfp4_decode import nvfp4_decode_gemm
from anyfp4.formats.nvfp4 import dequantize_nvfp4


@triton.jit
def fma_kernel(x_ptr, codes_ptr, scales_ptr, gs_ptr, part_ptr, N, K_ITERS, stride_c, stride_s,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr):
    """M = 1 only. acc3[BN, BK/8, 8] += w * x; MODE 0: real decode, 1: fake decode (codes as float)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_K // 8)
    i = tl.arange(0, 8)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 8, 8), dtype=tl.float32)
    for it in range(0, K_ITERS):
        k0 = (pid_k * K_ITERS + it) * BLOCK_K
        words = tl.load(codes_ptr + offs_n[:, None] * stride_c + (k0 // 8 + j)[None, :])
        sb = tl.load(scales_ptr + offs_n[:, None] * stride_s + (k0 // 16 + j // 2)[None, :])
        s = (sb.to(tl.int16) << 7).to(tl.float16, bitcast=True).to(tl.float32)
        x = tl.load(x_ptr + k0 + j[:, None] * 8 + i[None, :]).to(tl.float32)
        if MODE == 2:
            w = words[:, :, None].to(tl.float32)
        elif MODE == 0:
            c = words[:, :, None] >> (i * 4)[None, None, :]
            bits = ((c & 7) << 9) | ((c & 8) << 12)
            w = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        else:
            w = words[:, :, None].to(tl.float32) + i[None, None, :].to(tl.float32)
        acc += (w * s[:, :, None]) * x[None, :, :]
    tot = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(part_ptr + pid_k * N + offs_n, tot)


def fma_call(x, p, part, bn, bk, split, mode, warps):
    k_tiles = p.codes.shape[1] * 8 // bk
    fma_kernel[(p.codes.shape[0] // bn, split)](x, p.codes, p.scales, p.global_scale, part, p.codes.shape[0],
                                              k_tiles // split, p.codes.stride(0), p.scales.stride(0),
                                              BLOCK_N=bn, BLOCK_K=bk, MODE=mode, num_warps=warps)


def main():
    dev = torch.device("cuda")
    out = {}
    for n, k in [(14336, 4096), (28672, 8192)]:
        copies = max(2, int(512e6 // (n * k * 0.5625)) + 1)
        ws = [prepack_nvfp4(random_nvfp4(n, k, dev)) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.float16)
        # check the fma kernel once
        part = torch.zeros(8, ws[0].codes.shape[0], device=dev)
        fma_call(x, ws[0], part, 64, 128, 1, 0, 4)
        ref = (x.float() @ dequantize_nvfp4(__import__("anyfp4.packing.nvfp4", fromlist=["x"]).unprepack_nvfp4(ws[0])).t())[0]
        got = part[0, :n] * 16384 * ws[0].global_scale * 256  # s is bs*2^-8 here
        print("fma rel err", ((got - ref).norm() / ref.norm()).item(), flush=True)
        wbf = [torch.randn(n, k, device=dev, dtype=torch.float16) for _ in range(2)]
        t_bf = graph_time(lambda i: torch.nn.functional.linear(x, wbf[i % 2]))
        res = {"bf16_us": t_bf * 1e6}
        for bn in (16, 32, 64, 128):
            for bk in (128, 256, 512):
                for split in (1, 4, 8):
                    for warps in (4, 8):
                        kt = ws[0].codes.shape[1] * 8 // bk
                        if kt % split:
                            continue
                        part = torch.empty(split, ws[0].codes.shape[0], device=dev)
                        for mode in (0, 1):
                            try:
                                t = graph_time(lambda i: fma_call(x, ws[i % copies], part, bn, bk, split, mode, warps), reps=10, trials=3)
                            except Exception as e:
                                print("FAIL", bn, bk, split, warps, mode, type(e).__name__, str(e)[:100], flush=True)
                                continue
                            res.setdefault("all", []).append((mode, bn, bk, split, warps, round(t * 1e6, 2)))
                            key = f"fma_mode{mode}"
                            if key not in res or t * 1e6 < res[key][0]:
                                res[key] = (t * 1e6, bn, bk, split, warps)
        for bn, bk, split in [(64, 128, 8), (32, 256, 8), (128, 256, 4)]:
            kt = ws[0].codes.shape[1] * 8 // bk
            if kt % split:
                continue
            t = graph_time(lambda i: nvfp4_decode_gemm(x, ws[i % copies], None, DecodeConfig(bn, bk, split)), reps=10, trials=3)
            res.setdefault("dot", []).append((t * 1e6, bn, bk, split))
        out[f"{n}x{k}"] = res
        print(n, k, json.dumps(res), flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "variants.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
