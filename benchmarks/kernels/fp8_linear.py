"""FP8 weight-only linear on a CUDA GPU against bf16 F.linear and native torch._scaled_mm (W8A8).

    PYTHONPATH=src python benchmarks/kernels/fp8_linear.py --out fp8_linear.json [--ms 1 2 4 8 16 32 1024]

Same method and columns as nvfp4_linear.py: CUDA-graph medians over rotated weights, effective
GB/s (weight + activation + output bytes), % of the copy bandwidth measured in the same run,
speed-up over bf16. The `scaled_mm` column (sm_89+ only) times torch._scaled_mm on activations
already quantized to FP8 (M padded to 16, as it requires), i.e. a lower bound for the native path; the
`w8a8` column (sm_89+, M > 32) times the op itself with the opt-in ``ANYFP4_FP8_PREFILL=w8a8`` (activation
quantization, the weight written back as E4M3 bytes, ``_scaled_mm``, scales), against its float64 reference.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from anyfp4.bench.random_weights import random_bf16, random_fp8
from anyfp4.bench.shapes import DECODE_M, PREFILL_M, SHAPES
from anyfp4.bench.timing import ROTATE_BYTES, copy_bandwidth, graph_seconds
from anyfp4.formats.fp8 import dequantize_fp8
from anyfp4.ops.fp8 import fp8_linear
from anyfp4.packing.fp8 import prepack_fp8


def op(x, p, input_scale=None):
    return fp8_linear(x, p.codes, p.scales, None, p.out_features, p.in_features, 0, input_scale)


def w8a8_op(x, p, input_scale):
    """The op with ``ANYFP4_FP8_PREFILL=w8a8`` (read inside the op at call time)."""
    import os

    os.environ["ANYFP4_FP8_PREFILL"] = "w8a8"
    try:
        return op(x, p, input_scale)
    finally:
        del os.environ["ANYFP4_FP8_PREFILL"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="fp8_linear.json")
    ap.add_argument("--ms", type=int, nargs="+", default=DECODE_M + PREFILL_M)
    args = ap.parse_args()
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    sm = props.major * 10 + props.minor
    bw = copy_bandwidth(device, gib=4, repeats=12)
    report = {"gpu": props.name, "sm": sm, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
              "copy_bandwidth_Bps": bw, "linear": []}
    print(f"{props.name}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    # correctness first, on one odd shape
    w = random_fp8(4120, 1552, device)
    p = prepack_fp8(w)
    for m in (1, 5, 64):
        x = torch.randn(m, 1552, device=device, dtype=torch.bfloat16)
        ref = x.float() @ dequantize_fp8(w).t()
        err = ((op(x, p).float() - ref).norm() / ref.norm()).item()
        report.setdefault("rel_err", {})[m] = err
        print(f"check 4120x1552 M={m}: rel err {err:.2e}", flush=True)
    input_scale = torch.tensor([0.02], device=device)
    if sm >= 89:
        from anyfp4.formats.fp8 import e4m3_decode, e4m3_encode

        x = torch.randn(256, 1552, device=device, dtype=torch.bfloat16)
        xq = e4m3_decode(e4m3_encode(x.float() / 0.02)).double() * 0.02
        ref = xq @ dequantize_fp8(w).double().t()
        err = ((w8a8_op(x, p, input_scale).double() - ref).norm() / ref.norm()).item()
        report["rel_err_w8a8_m256"] = err
        print(f"check 4120x1552 M=256 w8a8: rel err {err:.2e} (against its own W8A8 reference)", flush=True)
    for n, k in SHAPES:
        copies = max(2, int(ROTATE_BYTES // (n * k)) + 1)
        ws = [prepack_fp8(random_fp8(n, k, device)) for _ in range(copies)]
        wbf = [random_bf16(n, k, device) for _ in range(2)]
        w8 = [random_fp8(n, k, device).weight for _ in range(2)] if sm >= 89 else []
        one = torch.ones((), device=device)
        for m in args.ms:
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            t_bf = graph_seconds(lambda i: torch.nn.functional.linear(x, wbf[i % 2]))
            t = graph_seconds(lambda i: op(x, ws[i % copies]), reps=20 if m <= 32 else 5)
            entry = {"n": n, "k": k, "m": m, "bf16_us": t_bf * 1e6, "fp8_us": t * 1e6}
            if w8:
                x8 = torch.randn(max(16, -(-m // 16) * 16), k, device=device).to(torch.float8_e4m3fn)
                t_s = graph_seconds(lambda i: torch._scaled_mm(x8, w8[i % 2].t(), one, one, out_dtype=torch.bfloat16))
                entry["scaled_mm_us"] = t_s * 1e6
                if m > 32:
                    entry["w8a8_us"] = graph_seconds(lambda i: w8a8_op(x, ws[i % copies], input_scale), reps=5) * 1e6
            moved = n * k + m * k * 2 + m * n * 2
            entry.update(gbps=moved / t / 1e9, pct_copy=100 * moved / t / bw, speedup=t_bf / t)
            report["linear"].append(entry)
            print(f"{n:>6}x{k:<6} M={m:<5} bf16 {t_bf * 1e6:8.2f} us  fp8 {t * 1e6:8.2f} us  {entry['pct_copy']:5.1f}% "
                  f"copy  x{entry['speedup']:.2f}" + (f"  scaled_mm {entry['scaled_mm_us']:.2f}" if w8 else "")
                  + (f"  w8a8 op {entry['w8a8_us']:.2f} (x{t_bf * 1e6 / entry['w8a8_us']:.2f})"
                     if "w8a8_us" in entry else ""), flush=True)
        ws = wbf = w8 = None  # this shape's weights freed before the next one's are made
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
