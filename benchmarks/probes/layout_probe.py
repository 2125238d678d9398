"""Which prepack layout to build: variants of the row-major CUDA decode kernel of commit ffc359e (its source
read from git, patched as text) timed at M = 1 on random data. Timing only — the patched kernels compute
wrong numbers on purpose:

- ``trans``: a pair bit layout (three of four pairs one shift and one mask; the first form of
  ``nvfp4_prepack.CODE_BITS``);
- ``clamp``: columns past M read the last activation row instead of zeros;
- ``tiled``: the same bytes read as 16 x 128 tiles (one contiguous 1 KiB per warp and step);
- ``noscale`` / ``fake1`` / ``raw``: no block-scale multiply / one mask per pair / no decode at all (bounds);
- ``lb``: __launch_bounds__ for 24 warps per multiprocessor.

    python benchmarks/probes/layout_probe.py   (writes $OUT/layout_probe.json or ./layout_probe.json)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from nvfp4_linear import graph_time, random_nvfp4  # noqa: E402

from anyfp4.kernels.cuda import weight_mma  # noqa: E402
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.kernels.cuda.weight_mma import nvfp4_mma_gemm  # noqa: E402
from anyfp4.bench.model import copy_bandwidth  # noqa: E402

ROW_MAJOR_COMMIT = "ffc359e"
BASE = subprocess.run(["git", "-C", str(ROOT), "show", f"{ROW_MAJOR_COMMIT}:src/anyfp4/kernels/cuda/weight_mma.cu"],
                      capture_output=True, text=True, check=True).stdout
LOOP = """                    for (int h = 0; h < 4; ++h) {
                        ha[h] = mul2(decode_pair(va >> (4 * h)), bsa);
                        hb[h] = mul2(decode_pair(vb >> (4 * h)), bsb);
                    }"""
BX = """                    if (b * 8 + g < M) {
                        bx[b] = *reinterpret_cast<const uint4*>(&xs[(b * 8 + g) * xs_stride + xoff + q * 4]);
                    } else {
                        bx[b] = make_uint4(0u, 0u, 0u, 0u);
                    }"""
BX_CLAMP = "                    bx[b] = *reinterpret_cast<const uint4*>(&xs[min(b * 8 + g, M - 1) * xs_stride + xoff + q * 4]);"
assert LOOP in BASE and BX in BASE
HELP = """
#define QM 0x81C081C0u
__device__ __forceinline__ u32 dec_d(u32 w) {
    return ((w >> 4) & 0x00C000C0u) | ((w >> 6) & 0x01000100u) | ((w << 2) & 0x80008000u);
}
extern "C" __global__"""
def trans(scale):
    m = (lambda e, s: f"mul2({e}, {s})") if scale else (lambda e, s: e)
    body = []
    for v, arr, s in (("va", "ha", "bsa"), ("vb", "hb", "bsb")):
        body += [f"{arr}[0] = {m(v + ' & QM', s)};", f"{arr}[1] = {m(f'({v} << 3) & QM', s)};",
                 f"{arr}[2] = {m(f'({v} << 6) & QM', s)};", f"{arr}[3] = {m(f'dec_d({v})', s)};"]
    return "                    { " + " ".join(body) + " }"
def fake1():
    return LOOP.replace("decode_pair(va >> (4 * h))", "((va >> (4 * h)) & 0x81C081C0u)").replace(
        "decode_pair(vb >> (4 * h))", "((vb >> (4 * h)) & 0x81C081C0u)")
def raw():
    return "                    for (int h = 0; h < 4; ++h) { ha[h] = va ^ (h << 3); hb[h] = vb ^ (h << 3); }"
def variant(loop=None, clamp=False):
    s = BASE.replace('extern "C" __global__', HELP, 1)
    if loop is not None:
        s = s.replace(LOOP, loop)
    if clamp:
        s = s.replace(BX, BX_CLAMP)
    return s
CP = """        cptr[a] = codes + (long long)rows[a] * stride_c4 + t;
        sptr[a] = scales + (long long)rows[a] * stride_s2 + t;  // FP8: unused"""
CP_T = """        cptr[a] = codes + (long long)(rows[a] - g) * stride_c4 + lane;
        sptr[a] = scales + (long long)(rows[a] - g) * stride_s2 + 2 * lane;"""
assert CP in BASE
def tiled(src, lb=False):
    assert CP in src
    src = src.replace(CP, CP_T)
    for v in ("s", "sn"):
        a = f"""wa[d][a] = cptr[a][{v} * 4];
                wb[d][a] = cptr[a][c8 + {v} * 4];
#if !FP8
                sa[d][a] = sptr[a][{v} * 4];
                sb[d][a] = sptr[a][s8 + {v} * 4];"""
        a2 = a.replace("                ", "                    ")
        b = f"""wa[d][a] = cptr[a][{v} * 64];
                wb[d][a] = cptr[a][32 + {v} * 64];
#if !FP8
                {{ const u32 both = reinterpret_cast<const u32*>(sptr[a])[{v} * 32]; sa[d][a] = both & 0xFFFFu; sb[d][a] = both >> 16; }}"""
        b2 = b.replace("                ", "                    ")
        n = src.count(a) + src.count(a2)
        assert n == 1, (v, n)
        src = src.replace(a, b).replace(a2, b2)
    if lb:
        src = src.replace("__launch_bounds__(WARPS * 32)", "__launch_bounds__(WARPS * 32, 768 / (WARPS * 32))")
    return src
VARIANTS = {
    "base": variant(), "clamp": variant(clamp=True), "trans": variant(trans(True)),
    "trans_clamp": variant(trans(True), True), "trans_noscale_clamp": variant(trans(False), True),
    "fake1_clamp": variant(fake1(), True), "raw_clamp": variant(raw(), True),
    "tiled": tiled(variant()), "tiled_trans_clamp": tiled(variant(trans(True), True)),
    "tiled_raw_clamp": tiled(variant(raw(), True)), "tiled_trans_clamp_lb": tiled(variant(trans(True), True), lb=True),
}
SHAPES = [(28672, 8192), (14336, 4096), (4096, 14336), (62080, 5120)]
CONFIGS = [MMAConfig(1, w, s, d) for w, s, d in [(8, 1, 4), (8, 4, 4), (8, 8, 2), (4, 8, 2), (4, 1, 8), (8, 2, 4)]]
def prepack_row_major(w, device):
    """The row-major prepack of the probed kernel: checkpoint bytes, padded."""
    from types import SimpleNamespace
    n, k = w.packed.shape[0], w.packed.shape[1] * 2
    n_pad, k_pad = -(-n // 128) * 128, -(-k // 256) * 256
    codes = torch.zeros(n_pad, k_pad // 2, dtype=torch.uint8, device=device)
    codes[:n, :k // 2] = w.packed
    scales = torch.zeros(n_pad, k_pad // 16, dtype=torch.uint8, device=device)
    scales[:n, :k // 16] = w.block_scale.view(torch.uint8)
    return SimpleNamespace(codes=codes.view(torch.int32), scales=scales, global_scale=w.global_scale.reshape(1).float(),
                           out_features=n, in_features=k, up_offset=0)


def main():
    dev = torch.device("cuda", 0)
    bw = copy_bandwidth(dev)
    out = {"copy_Bps": bw, "rows": []}
    print(f"copy {bw/1e12:.2f} TB/s", flush=True)
    for n, k in SHAPES:
        nbytes = n * k * 0.5625
        copies = max(2, int(512 * 2**20 // nbytes) + 1)
        ws = [prepack_row_major(random_nvfp4(n, k, dev), dev) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        wb = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(max(2, int(512 * 2**20 // (n * k * 2)) + 1))]
        t_bf16 = graph_time(lambda i: torch.nn.functional.linear(x, wb[i % len(wb)]))
        line = {"shape": [n, k], "bf16_us": t_bf16 * 1e6}
        for name, src in VARIANTS.items():
            weight_mma._source = lambda src=src: src
            best = (1e9, None)
            for c in CONFIGS:
                if c.split_k > (k // 128):
                    continue
                try:
                    t = graph_time(lambda i: nvfp4_mma_gemm(x, ws[i % len(ws)], None, c))
                except Exception as e:
                    print(name, c, "ERR", str(e)[:200], flush=True); continue
                best = min(best, (t, c), key=lambda z: z[0])
            line[name] = {"us": best[0] * 1e6, "config": str(best[1]), "pct_copy": 100 * nbytes / best[0] / bw}
            print(f"{n}x{k} {name:22s} {best[0]*1e6:7.2f} us {100*nbytes/best[0]/bw:5.1f}% copy  x{t_bf16/best[0]:.2f} bf16  {best[1]}", flush=True)
        out["rows"].append(line)
        del ws, wb
        torch.cuda.empty_cache()
        Path(os.environ.get("OUT", "."), "layout_probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
