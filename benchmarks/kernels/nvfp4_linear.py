"""NVFP4 linear on a CUDA GPU: correctness against the reference, a launch-config sweep, and timings.

    PYTHONPATH=src python benchmarks/kernels/nvfp4_linear.py --out results.json [--tune] [--quick]

The NVFP4 column times the production op (``torch.ops.anyfp4.*``, its own M dispatch); with
``--tune`` the decode kernel's launch configs are swept per shape and M as well; above M = 32 the fused
prefill GEMM (``ANYFP4_PREFILL=fused``) is timed in a few tile configs beside the default dequantize + cuBLAS. Every timing is the median of CUDA-graph replays of R back-to-back calls that rotate over enough
weight copies to exceed the L2 cache several times (random codes and scales, never zeros).
Columns: us per call, effective GB/s (codes + scales + activations + output), % of the
device-to-device copy bandwidth measured in the same run, and speed-up over bf16 F.linear
(cuBLAS) timed the same way in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from anyfp4.bench.random_weights import random_bf16, random_nvfp4
from anyfp4.bench.shapes import DECODE_M, PREFILL_M, SHAPES
from anyfp4.bench.timing import ROTATE_BYTES, copy_bandwidth, graph_seconds
from anyfp4.dispatch.configs import DecodeConfig, FusedConfig
from anyfp4.dispatch.tuning import heuristic_config
from anyfp4.formats.nvfp4 import NVFP4Weight, dequantize_nvfp4
from anyfp4.kernels.triton.nvfp4_decode import nvfp4_decode_gemm, nvfp4_fused_gemm
from anyfp4.kernels.triton.nvfp4_dequant import nvfp4_dequantize, nvfp4_prefill_gemm
from anyfp4.ops.nvfp4 import nvfp4_prepacked_linear as nvfp4_op
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_correctness(device, report: dict) -> None:
    """Decode, gated and prefill against the reference on fresh random data; pack on/off and
    repeated runs bit-identical; poisoned outputs overwritten; large activations stay finite."""
    torch.backends.cuda.matmul.allow_tf32 = False
    results = []
    failures = []
    gen = torch.Generator(device=device).manual_seed(1234)
    for (n, k), dtype in itertools.product([(4120, 1552), (4096, 4096)], [torch.float16, torch.bfloat16]):
        w = random_nvfp4(n, k, device)
        p = prepack_nvfp4(w)
        wd = dequantize_nvfp4(w)
        # dequant bit-exact
        d = nvfp4_dequantize(p, dtype)
        if not torch.equal(d, wd.to(dtype)):
            failures.append(f"dequant not bit-exact {n}x{k} {dtype}")
        gate, up = random_nvfp4(n, k, device), random_nvfp4(n, k, device)
        up = NVFP4Weight(up.packed, up.block_scale, gate.global_scale)
        pg = prepack_nvfp4_gated(gate, up)
        gd, ud = dequantize_nvfp4(gate), dequantize_nvfp4(up)
        for m in [1, 2, 4, 5, 7, 8, 9, 15, 16, 17, 32, 64, 256]:
            x = torch.randn(m, k, device=device, generator=gen).to(dtype)
            ref = x.float() @ wd.t()
            gref = torch.nn.functional.silu(x.float() @ gd.t()) * (x.float() @ ud.t())
            tol = 2e-3 if dtype == torch.float16 else 8e-3
            if m <= 32:
                sms = torch.cuda.get_device_properties(device).multi_processor_count
                cfgs = [heuristic_config(n, p.codes.shape[1] * 8, sms), DecodeConfig(block_n=128, block_k=128, split_k=1)]
                for cfg in cfgs:
                    outs = []
                    for pack in (False, True):
                        out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
                        y = nvfp4_decode_gemm(x, p, None, cfg, act_pack=pack, out=out)
                        outs.append(y.clone())
                        y2 = nvfp4_decode_gemm(x, p, None, cfg, act_pack=pack)
                        if not torch.equal(y, y2):
                            failures.append(f"nondeterministic {n}x{k} m={m} {cfg} pack={pack}")
                        if torch.isnan(y).any():
                            failures.append(f"unwritten/NaN output {n}x{k} m={m} {cfg} pack={pack}")
                        e = rel_err(y, ref)
                        if not e < tol:
                            failures.append(f"decode error {e:.2e} {n}x{k} m={m} {dtype} {cfg} pack={pack}")
                        yg = nvfp4_decode_gemm(x, pg, None, cfg, act_pack=pack)
                        eg = rel_err(yg, gref)
                        if not eg < tol * 2:
                            failures.append(f"gated error {eg:.2e} {n}x{k} m={m} {dtype} {cfg} pack={pack}")
                        results.append({"n": n, "k": k, "m": m, "dtype": str(dtype), "cfg": cfg.__dict__,
                                        "pack": pack, "rel_err": e, "gated_rel_err": eg})
                    if not torch.equal(outs[0], outs[1]):
                        failures.append(f"pack on/off differ {n}x{k} m={m} {cfg}")
            else:
                y = nvfp4_prefill_gemm(x, p, None)
                e = rel_err(y, ref)
                yg = nvfp4_prefill_gemm(x, pg, None)
                eg = rel_err(yg, gref)
                if not (e < tol and eg < tol * 2):
                    failures.append(f"prefill error {e:.2e}/{eg:.2e} {n}x{k} m={m} {dtype}")
                results.append({"n": n, "k": k, "m": m, "dtype": str(dtype), "prefill": True, "rel_err": e,
                                "gated_rel_err": eg})
                for fc in FUSED_CONFIGS[:2]:  # ANYFP4_PREFILL=fused
                    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
                    y = nvfp4_fused_gemm(x, p, None, fc, out=out)
                    e, eg = rel_err(y, ref), rel_err(nvfp4_fused_gemm(x, pg, None, fc), gref)
                    if torch.isnan(y).any() or not (e < tol and eg < tol * 2):
                        failures.append(f"fused prefill error {e:.2e}/{eg:.2e} {n}x{k} m={m} {dtype} {fc}")
                    if not torch.equal(y, nvfp4_fused_gemm(x, p, None, fc)):
                        failures.append(f"nondeterministic fused prefill {n}x{k} m={m} {fc}")
                    results.append({"n": n, "k": k, "m": m, "dtype": str(dtype), "fused": fc.__dict__, "rel_err": e,
                                    "gated_rel_err": eg})
        # large activations: fp16 |x| up to 6e4 must not overflow where the true result is finite
        if dtype == torch.float16:
            x = (torch.rand(4, k, device=device, generator=gen) * 2 - 1) * 6e4
            x = x.to(dtype)
            y = nvfp4_decode_gemm(x, p, None, heuristic_config(n, p.codes.shape[1] * 8, 132)).float()
            ref = x.float() @ wd.t()
            finite_ref = ref.abs() < 6e4
            if not torch.isfinite(y[finite_ref]).all():
                failures.append(f"overflow with large activations {n}x{k}")
    report["correctness"] = {"checks": len(results), "failures": failures, "max_rel_err": max(r["rel_err"] for r in results)}
    print(f"correctness: {len(results)} checks, {len(failures)} failures")
    for f in failures[:20]:
        print("  FAIL", f)


# (block_m, block_n, block_k, num_warps, num_stages) of the fused prefill GEMM timed at M > 32
FUSED_CONFIGS = [FusedConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s)
                 for bm, bn, bk, w, s in ((128, 128, 128, 8, 3), (64, 128, 128, 4, 3), (128, 64, 128, 4, 4), (128, 128, 64, 8, 4))]


def candidate_configs(k_pad: int):
    for block_n, block_k in itertools.product((32, 64, 128), (128, 256)):
        k_tiles = k_pad // block_k
        for split in (1, 2, 4, 8, 16, 32):
            if k_tiles % split == 0 and k_tiles // split >= 1:
                yield DecodeConfig(block_n=block_n, block_k=block_k, split_k=split, num_warps=4, num_stages=3)


def bench_shapes(device, report: dict, tune: bool, quick: bool, ms: list[int]) -> None:
    bw = report["copy_bandwidth_Bps"]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    dtype = torch.bfloat16
    rows, table = [], {}
    shapes = SHAPES[:3] + SHAPES[-1:] if quick else SHAPES
    for n, k in shapes:
        nbytes_w = n * k * 0.5625
        copies = max(2, int(ROTATE_BYTES // nbytes_w) + 1)
        ws = [prepack_nvfp4(random_nvfp4(n, k, device)) for _ in range(copies)]
        bf_copies = max(2, int(ROTATE_BYTES // (n * k * 2)) + 1)
        wbf = [random_bf16(n, k, device) for _ in range(bf_copies)]
        k_pad = ws[0].codes.shape[1] * 8
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=dtype)
            t_bf16 = graph_seconds(lambda i: torch.nn.functional.linear(x, wbf[i % bf_copies]))
            entry = {"n": n, "k": k, "m": m, "bf16_us": t_bf16 * 1e6}
            t_op = graph_seconds(lambda i: nvfp4_op(x, ws[i % copies]), reps=20 if m <= 32 else 5)
            best_t = t_op
            entry.update(nvfp4_us=t_op * 1e6, path="gemv" if m == 1 else "decode" if m <= 32 else "dequant+cublas")
            if 2 <= m <= 32:
                cfg = heuristic_config(n, k_pad, sms)
                if tune:
                    best_cfg, best_ct = cfg, graph_seconds(lambda i: nvfp4_decode_gemm(x, ws[i % copies], None, cfg))
                    for c in candidate_configs(k_pad):
                        t = graph_seconds(lambda i: nvfp4_decode_gemm(x, ws[i % copies], None, c), reps=10, trials=3)
                        if t < best_ct:
                            best_cfg, best_ct = c, t
                    table[f"{k},{n},{m}"] = best_cfg.__dict__
                    cfg = best_cfg
                t_pack = graph_seconds(lambda i: nvfp4_decode_gemm(x, ws[i % copies], None, cfg, act_pack=True))
                entry.update(pack_us=t_pack * 1e6, config=cfg.__dict__)
            if m > 32:  # ANYFP4_PREFILL=fused: the decode kernel over row tiles, no dense copy of the weight
                fused = {}
                for fc in FUSED_CONFIGS:
                    try:
                        fused[str(tuple(fc.__dict__.values()))] = graph_seconds(
                            lambda i: nvfp4_fused_gemm(x, ws[i % copies], None, fc), reps=5) * 1e6
                    except Exception as e:  # a tile the GPU cannot hold (shared memory): not a candidate
                        fused[str(tuple(fc.__dict__.values()))] = f"{type(e).__name__}"
                times = [v for v in fused.values() if isinstance(v, float)]
                entry.update(fused_us=min(times) if times else None, fused_configs=fused)
            moved = nbytes_w + m * k * 2 + m * n * 2
            entry.update(gbps=moved / best_t / 1e9, pct_copy=100 * moved / best_t / bw, speedup=t_bf16 / best_t)
            rows.append(entry)
            print(f"{n:>6}x{k:<6} M={m:<5} bf16 {t_bf16 * 1e6:8.2f} us  nvfp4 {best_t * 1e6:8.2f} us  "
                  f"{entry['gbps']:7.0f} GB/s  {entry['pct_copy']:5.1f}% copy  x{entry['speedup']:.2f}"
                  + (f"  pack {entry['pack_us']:.2f}" if "pack_us" in entry else "")
                  + (f"  fused {entry['fused_us']:.2f} (x{t_bf16 * 1e6 / entry['fused_us']:.2f})"
                     if entry.get("fused_us") else ""), flush=True)
        ws = wbf = None  # this shape's weights freed before the next one's are made
        torch.cuda.empty_cache()
        report["linear"], report["tuned_table"] = rows, table
        save(report)
    report["linear"] = rows
    report["tuned_table"] = table


def bench_gated(device, report: dict) -> None:
    """gate+up 2 x 14336 x 4096 through torch.ops.anyfp4.nvfp4_gated vs one bf16 F.linear of the
    concatenated weight + SiLU * mul."""
    n, k = 14336, 4096
    dtype = torch.bfloat16
    copies = 4
    ws = []
    for _ in range(copies):
        gate, up = random_nvfp4(n, k, device), random_nvfp4(n, k, device)
        ws.append(prepack_nvfp4_gated(gate, NVFP4Weight(up.packed, up.block_scale, gate.global_scale)))
    wbf = [random_bf16(2 * n, k, device) for _ in range(3)]
    rows = []
    for m in (1, 8, 32):
        x = torch.randn(m, k, device=device, dtype=dtype)

        def bf16(i):
            y = torch.nn.functional.linear(x, wbf[i % 3])
            return torch.nn.functional.silu(y[:, :n]) * y[:, n:]

        t_bf = graph_seconds(bf16)
        t = graph_seconds(lambda i: nvfp4_op(x, ws[i % copies]))
        rows.append({"m": m, "bf16_us": t_bf * 1e6, "nvfp4_us": t * 1e6, "speedup": t_bf / t})
        print(f"gated 2x{n}x{k} M={m}: bf16 {t_bf * 1e6:.2f} us  nvfp4 {t * 1e6:.2f} us  x{t_bf / t:.2f}", flush=True)
    report["gated"] = rows


OUT_PATH = Path("nvfp4_linear.json")


def save(report: dict) -> None:
    OUT_PATH.write_text(json.dumps(report, indent=1))


def main() -> None:
    global OUT_PATH
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="nvfp4_linear.json")
    ap.add_argument("--tune", action="store_true", help="sweep launch configs per shape and M")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--correctness-only", action="store_true")
    ap.add_argument("--ms", type=int, nargs="+", default=DECODE_M + PREFILL_M, help="activation rows to time")
    args = ap.parse_args()
    OUT_PATH = Path(args.out)
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    report = {"gpu": props.name, "sm": f"{props.major}{props.minor}", "sms": props.multi_processor_count,
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    import triton

    report["triton"] = triton.__version__
    report["copy_bandwidth_Bps"] = copy_bandwidth(device, gib=4, repeats=12)
    print(f"{props.name}: copy bandwidth {report['copy_bandwidth_Bps'] / 1e12:.2f} TB/s", flush=True)
    if not args.skip_correctness:
        check_correctness(device, report)
        save(report)
    if args.correctness_only:
        return
    bench_shapes(device, report, args.tune, args.quick, args.ms)
    bench_gated(device, report)
    save(report)


if __name__ == "__main__":
    main()
