"""Probe 2: 2-D GEMV, static loop over the 8 nibble positions, no 3-D tensors."""
import sys, os, json
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch, triton, triton.language as tl


@triton.jit
def gemv2(x_ptr, codes_ptr, scales_ptr, part_ptr, N, K_ITERS, stride_c, stride_s,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_K // 8)
    acc = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
    for it in range(0, K_ITERS):
        t = pid_k * K_ITERS + it
        k0 = t * BLOCK_K
        words = tl.load(codes_ptr + offs_n[:, None] * stride_c + (t * (BLOCK_K // 8) + j)[None, :])
        sb = tl.load(scales_ptr + offs_n[:, None] * stride_s + (t * (BLOCK_K // 16) + j // 2)[None, :])
        s = (sb.to(tl.int32) << 20).to(tl.float32, bitcast=True)  # bs * 2^-120 (normal), exact
        part = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
        for i in tl.static_range(8):
            xi = tl.load(x_ptr + k0 + j * 8 + i).to(tl.float32)
            if MODE == 0:
                c = words >> (4 * i)
                bits = ((c & 7) << 9) | ((c & 8) << 12)
                w = bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            else:
                w = (words >> (4 * i)).to(tl.float32)
            part += w * xi[None, :]
        acc += part * s
    tot = tl.sum(acc, axis=1)
    tl.store(part_ptr + pid_k * N + offs_n, tot)


def call(x, p, part, bn, bk, split, mode, warps):
    kt = p.codes.shape[1] * 8 // bk
    gemv2[(p.codes.shape[0] // bn, split)](x, p.codes, p.scales, part, p.codes.shape[0], kt // split,
                                         p.codes.stride(0), p.scales.stride(0), BLOCK_N=bn, BLOCK_K=bk, MODE=mode,
                                         num_warps=warps)


def main():
    from nvfp4_linear import graph_time, random_nvfp4
    from anyfp4.packing.nvfp4 import prepack_nvfp4, unprepack_nvfp4
    from anyfp4.formats.nvfp4 import dequantize_nvfp4
    dev = torch.device("cuda")
    out = {}
    for n, k in [(14336, 4096), (28672, 8192)]:
        copies = max(2, int(512e6 // (n * k * 0.5625)) + 1)
        ws = [prepack_nvfp4(random_nvfp4(n, k, dev)) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.float16)
        part = torch.zeros(1, ws[0].codes.shape[0], device=dev)
        call(x, ws[0], part, 64, 512, 1, 0, 4)
        ref = (x.float() @ dequantize_nvfp4(unprepack_nvfp4(ws[0])).t())[0]
        got = part[0, :n] * 16384 * ws[0].global_scale * 2.0**120
        print("rel err", ((got - ref).norm() / ref.norm()).item(), flush=True)
        wbf = [torch.randn(n, k, device=dev, dtype=torch.float16) for _ in range(2)]
        res = {"bf16_us": graph_time(lambda i: torch.nn.functional.linear(x, wbf[i % 2])) * 1e6, "all": []}
        for bn in (8, 16, 32, 64):
            for bk in (256, 512, 1024):
                for split in (1, 4, 8):
                    for warps in (2, 4, 8):
                        kt = ws[0].codes.shape[1] * 8 // bk
                        if kt % split:
                            continue
                        part = torch.empty(split, ws[0].codes.shape[0], device=dev)
                        for mode in (0, 1):
                            try:
                                t = graph_time(lambda i: call(x, ws[i % copies], part, bn, bk, split, mode, warps), reps=10, trials=3)
                            except Exception as e:
                                print("FAIL", bn, bk, split, warps, mode, type(e).__name__, str(e)[:80], flush=True)
                                continue
                            res["all"].append((mode, bn, bk, split, warps, round(t * 1e6, 2)))
        out[f"{n}x{k}"] = res
        print(n, k, "bf16", round(res["bf16_us"], 1), sorted(res["all"], key=lambda r: r[-1])[:8], flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "gemv2.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
