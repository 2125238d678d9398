"""The CUDA (NVRTC) tensor-core decode kernel on a GPU: correctness against the reference for every
config family, then a launch-config sweep against the production op and bf16 cuBLAS in one run.

    PYTHONPATH=src python benchmarks/probes/mma_sweep.py --out mma_sweep.json [--quick] [--formats nvfp4 fp8] \
        [--skip-check]
    PYTHONPATH=src python benchmarks/probes/mma_sweep.py --skip-check --shapes 6144x4096 3072x4096 \
        --gated 7168x4096 --ms 1 2 4 8
    PYTHONPATH=src python benchmarks/probes/mma_sweep.py --skip-check --after-norm --ms 1 ...

``--after-norm`` times every call (each config, bf16, the op) behind an add + RMSNorm kernel that writes its input, as
in a decode step, where a linear follows a norm (or the attention) rather than another linear; the norm's own chain
is timed too (``norm_us``), and every time includes it.

The best config per (format, shape, M) is what `dispatch/tables/cuda_mma_h200.json` holds (`--print-table` writes a sweep in that shape); the output file
also works as it is as an extra table (``ANYFP4_MMA_TABLE=mma_sweep.json``) on GPUs of the same kind. The K slices
(split-K blocks x K warps) set a row's bits, so every M of a shape runs with one number of them: M = 1 is swept
over all, every other M at the ``--slice-candidates`` fastest of M = 1, and the count best over all M (relative to
each M's fastest) is kept (when M = 1 is not swept, the table's).

2026-11-29, H200 (results/nvfp4_mma_sweep_h200.json, fp8_mma_sweep_h200.json, nvfp4_mma_sweep_tiled_h200.json,
nvfp4_mma_sweep_llama8b_tp_shapes_h200.json): the sm_90 launch table's entries; NVFP4 28672x8192 at M = 1 in
43.7 us (73% of copy, 2.53x bf16). Run again for a new kernel or GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from anyfp4.bench.random_weights import random_fp8, random_nvfp4
from anyfp4.bench.shapes import SHAPES
from anyfp4.bench.timing import ROTATE_BYTES, copy_bandwidth, graph_seconds
from anyfp4.dispatch.configs import MMAConfig
from anyfp4.dispatch.tuning import mma_config
from anyfp4.dispatch.tuning import mma_heuristic_config as heuristic_config
from anyfp4.formats.nvfp4 import NVFP4Weight, dequantize_nvfp4
from anyfp4.kernels.glue.rms_norm import add_rms_norm_triton
from anyfp4.kernels.cuda.weight_mma import fp8_mma_gemm, k_slices, k_warps_refusal, n_tiles_for, nvfp4_mma_gemm
from anyfp4.ops.nvfp4 import nvfp4_prepacked_linear as nvfp4_op
from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated


def rel_err(y, ref):
    return ((y.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


SLICE_COUNTS = (1, 2, 4, 8, 16, 32)  # the K-slice counts M = 1 is swept over unless --slice-counts names others


def configs_for(m: int, gated: bool, k_pad: int, step: int = 128, slices: int = 0, k_warps=(1, 2, 4, 8),
                counts=SLICE_COUNTS, rings=(0,), wgmmas=(0,)):
    """Launch configs to time; ``slices`` (> 0) fixes the K slices, split-K x K warps (M > 1 runs with M = 1's
    slices, see below), else each of ``counts``; ``k_warps``: the K warps per row tile to try (K warps beside a
    count that is not a power of two: refused by the kernel, skipped); ``rings``: 0 register rings, 1 shared rings
    (their depth costs no registers: the register limits below do not apply; a launch whose shared memory does
    not fit is refused and skipped); ``wgmmas``: 0 mma.sync, 1 / 2 warpgroup mmas (one K warp, 4 or 8 warps, a
    register ring)."""
    steps = k_pad // step
    totals = (slices,) if slices else counts
    for mt, warps, total, depth, kw, ring, wg in itertools.product((1, 2, 4), (2, 4, 8), totals, (2, 4, 8), k_warps,
                                                                   rings, wgmmas):
        if wg and (kw > 1 or warps == 2 or ring or depth == 8 or mt == 4):
            continue  # the kernel's warpgroup mmas: one K warp, whole warpgroups, a register ring; registers
        if ring:
            if mt == 4 or (mt == 2 and gated):
                continue  # the sums' registers
        elif (mt == 4) != (warps == 2) and not (mt == 4 and warps == 4):
            continue  # four m16 tiles per warp (M > 8: a quarter of the staged-activation reads) in 2 or 4 warps
        elif mt == 4 and (gated or n_tiles_for(m) == 1 or depth > 2):
            continue  # registers
        elif mt == 2 and gated and n_tiles_for(m) > 1:
            continue
        elif depth == 8 and (mt > 1 or gated or n_tiles_for(m) > 1):
            continue
        elif depth == 4 and mt == 2 and gated:
            continue
        if total > steps or (total == 32 and not slices and kw < 4):
            continue
        cfg = MMAConfig(mt=mt, warps=warps, split_k=total // kw, depth=depth, kw=kw, shared_ring=ring, wgmma=wg)
        if total % kw or k_warps_refusal(cfg, steps):
            continue  # K warps the kernel does not take
        if depth > 2 and depth > -(-steps // total):
            continue  # a ring longer than a slice
        yield cfg


def check(device, failures, results):
    gen = torch.Generator(device=device).manual_seed(7)
    for (n, k), dtype in itertools.product([(4120, 1552), (4096, 4096), (384, 4352)], [torch.float16, torch.bfloat16]):
        w = random_nvfp4(n, k, device)
        if n == 384:  # every block-scale byte, subnormal E4M3 scales and zero included
            sb = torch.randint(0, 0x7F, (n, k // 16), dtype=torch.uint8, device=device)
            w = NVFP4Weight(w.packed, sb.view(torch.float8_e4m3fn), w.global_scale)
        p = prepack_nvfp4(w)
        wd = dequantize_nvfp4(w).double()
        gate, up = random_nvfp4(n, k, device), random_nvfp4(n, k, device)
        up = NVFP4Weight(up.packed, up.block_scale, gate.global_scale)
        pg = prepack_nvfp4_gated(gate, up)
        gd, ud = dequantize_nvfp4(gate).double(), dequantize_nvfp4(up).double()
        bias = torch.randn(n, device=device, generator=gen).to(dtype)
        for m in [1, 2, 3, 5, 8, 9, 16, 17, 31, 32]:
            x = torch.randn(m, k, device=device, generator=gen).to(dtype)
            if m == 3:  # magnitudes across the range the bf16 split must keep exact
                span = 6 if dtype == torch.bfloat16 else 3
                x = x * torch.logspace(-span, span, k, device=device).to(dtype)
            ref = x.double() @ wd.t()
            refb = ref + bias.double()
            gref = torch.nn.functional.silu(x.double() @ gd.t()) * (x.double() @ ud.t())
            cfgs = [heuristic_config(n, p.codes.shape[1] * 8, m, 132, False), MMAConfig(mt=1, warps=4, split_k=1, depth=2),
                    MMAConfig(mt=1, warps=8, split_k=3, depth=8)]
            if m <= 8:
                cfgs.append(MMAConfig(mt=2, warps=4, split_k=5, depth=4))
            else:
                cfgs.append(MMAConfig(mt=4, warps=2, split_k=3, depth=2))
            steps = p.codes.shape[1] * 8 // 128
            for kcfg in (MMAConfig(mt=1, warps=8, split_k=1, depth=2, kw=8), MMAConfig(mt=1, warps=4, split_k=2, depth=4, kw=2)):
                if steps % k_slices(kcfg) == 0 and m <= 16:
                    cfgs.append(kcfg)  # K warps: the bits of split-K alone with as many slices
                    same = MMAConfig(mt=1, warps=kcfg.warps, split_k=k_slices(kcfg), depth=kcfg.depth)
                    if not torch.equal(nvfp4_mma_gemm(x, p, None, kcfg), nvfp4_mma_gemm(x, p, None, same)):
                        failures.append(f"K warps not the bits of split-K {k_slices(kcfg)}: {n}x{k} m={m} {dtype} {kcfg}")
            for cfg in cfgs:
                try:
                    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)
                    y = nvfp4_mma_gemm(x, p, None, cfg, out=out).clone()
                    y2 = nvfp4_mma_gemm(x, p, None, cfg)
                    yb = nvfp4_mma_gemm(x, p, bias, cfg)
                    cg = MMAConfig(mt=1, warps=max(cfg.warps, 4), split_k=cfg.split_k, depth=min(cfg.depth, 4))
                    yg = nvfp4_mma_gemm(x, pg, None, cg)
                except ValueError as e:  # row tile larger than the prepack
                    results.append({"n": n, "k": k, "m": m, "cfg": cfg.__dict__, "skipped": str(e)})
                    continue
                e, eb, eg = rel_err(y, ref), rel_err(yb, refb), rel_err(yg, gref)
                if m == 3 and dtype == torch.float16:
                    eg = 0.0  # silu(gate) * up of activations up to 1e3 overflows fp16 in the reference too
                tol = 1e-3 if dtype == torch.float16 else 6e-3
                tag = f"{n}x{k} m={m} {dtype} {cfg}"
                if torch.isnan(y).any():
                    failures.append(f"NaN/unwritten {tag}")
                if not torch.equal(y, y2):
                    failures.append(f"nondeterministic {tag}")
                if not (e < tol and eb < tol and eg < 2 * tol):
                    failures.append(f"error {e:.2e}/{eb:.2e}/{eg:.2e} {tag}")
                results.append({"n": n, "k": k, "m": m, "dtype": str(dtype), "cfg": cfg.__dict__, "rel_err": e,
                                "bias_rel_err": eb, "gated_rel_err": eg})
    print(f"correctness: {len(results)} cases, {len(failures)} failures", flush=True)
    for f in failures[:20]:
        print("  FAIL", f, flush=True)


def fp8_op(x, w):
    return torch.ops.anyfp4.fp8_linear(x, w.codes, w.scales, None, w.out_features, w.in_features)


FORMATS = {  # name: (make a random prepack, bytes per weight, kernel, op, main-loop k step)
    "nvfp4": (lambda n, k, d: prepack_nvfp4(random_nvfp4(n, k, d)), 9 / 16, nvfp4_mma_gemm, nvfp4_op, 128),
    "fp8": (lambda n, k, d: prepack_fp8(random_fp8(n, k, d)), 1.0, fp8_mma_gemm, fp8_op, 64),
}


def table_slices(device, fmt, gated, n, k, k_pad) -> int:
    """The K slices the op runs every M of this shape with (its M = 1 launch entry's): a row's bits must not depend
    on M, so configs for M > 1 are timed with them only."""
    props = torch.cuda.get_device_properties(device)
    return k_slices(mma_config(props.major * 10 + props.minor, props.multi_processor_count, fmt, gated, n, k, k_pad, 1))


def best_by_slices(time_config, m: int, gated: bool, k_pad: int, step: int, slices: int = 0,
                   counts=SLICE_COUNTS, rings=(0,), wgmmas=(0,)) -> dict:
    """{K slices: (seconds, config)}: the fastest config at ``m`` rows for each number of K slices (only ``slices``
    if > 0); ``time_config(cfg, m)`` times one (None where the launch refuses it)."""
    best: dict = {}
    for cfg in configs_for(m, gated, k_pad, step, slices, counts=counts, rings=rings, wgmmas=wgmmas):
        t = time_config(cfg, m)
        if t is not None and (k_slices(cfg) not in best or t < best[k_slices(cfg)][0]):
            best[k_slices(cfg)] = (t, cfg)
    return best


def choose_slices(ms: list[int], timed: dict) -> int:
    """The K slices every M of a shape runs with (they set a row's bits, so one number for all M): of the
    candidates timed at every M (``timed[m][slices] = (seconds, config)``), the one whose time, relative to the
    fastest candidate at each M, is least on average; M = 1 breaks ties."""
    candidates = set.intersection(*(set(timed[m]) for m in ms))

    def cost(sl):
        return (sum(timed[m][sl][0] / min(t for t, _ in timed[m].values()) for m in ms) / len(ms), timed[ms[0]][sl][0])

    return min(candidates, key=cost)


def sweep_shape(time_config, ms: list[int], gated: bool, k_pad: int, step: int, candidates: int,
                fixed_slices: int = 0, counts=SLICE_COUNTS, rings=(0,), wgmmas=(0,)) -> tuple[int, dict]:
    """(the K slices chosen, ``timed``): M = 1 over every number of slices (or ``fixed_slices``), then the other M
    at the ``candidates`` fastest slice counts of M = 1 (``choose_slices`` picks among them)."""
    first = best_by_slices(time_config, ms[0], gated, k_pad, step, fixed_slices, counts, rings, wgmmas)
    ranked = sorted(first, key=lambda sl: first[sl][0])[:max(1, candidates)]
    timed = {ms[0]: {sl: first[sl] for sl in ranked}}
    for m in ms[1:]:
        timed[m] = {}
        for sl in ranked:
            timed[m].update(best_by_slices(time_config, m, gated, k_pad, step, sl, rings=rings, wgmmas=wgmmas))
    return choose_slices(ms, timed), timed


def behind_norm(xs: dict) -> dict:
    """For each activation buffer of ``xs``: a call that writes it with an add + RMSNorm (a residual row plus a delta,
    normed), as the norm before a decode step's linear writes that linear's input."""
    runs = {}
    for m, x in xs.items():
        residual, delta = torch.randn_like(x), torch.randn_like(x)
        h, weight = torch.empty_like(x), torch.rand(x.shape[1], device=x.device, dtype=x.dtype) + 0.5
        runs[m] = lambda residual=residual, delta=delta, h=h, weight=weight, x=x: add_rms_norm_triton(
            residual, delta, weight, 1e-5, out=(h, x))
    return runs


def sweep(device, report, quick, fmt, shapes=None, gated_shapes=((14336, 4096),), ms=None, candidates=2,
          after_norm=False, keep_slices=False, counts=SLICE_COUNTS, rings=(0,), wgmmas=(0,)):
    torch.backends.cuda.matmul.allow_tf32 = False
    make, bpw, kernel, op, step = FORMATS[fmt]
    if shapes is None:
        shapes = SHAPES[:3] + [(28672, 8192)] if quick else SHAPES
    ms = sorted(ms or ([1, 8, 32] if quick else [1, 2, 4, 8, 16, 32]))
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for n, k in shapes:
        copies = max(2, int(ROTATE_BYTES // (n * k * bpw)))
        ws = [make(n, k, device) for _ in range(copies)]
        bcopies = max(2, ROTATE_BYTES // (n * k * 2))
        wb = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(bcopies)]
        k_pad = ws[0].codes.shape[1] * (8 if fmt == "nvfp4" else 4)
        xs = {m: torch.randn(m, k, device=device, dtype=torch.bfloat16) for m in ms}
        timed_calls = in_context(xs, after_norm)
        rows: dict = {m: [] for m in ms}

        def time_config(cfg, m):
            try:
                t = timed_calls(m, lambda i: kernel(xs[m], ws[i % copies], None, cfg))
            except ValueError:
                return None
            rows[m].append({"cfg": cfg.__dict__, "us": t * 1e6})
            return t

        fixed = 0 if ms[0] == 1 and not keep_slices else table_slices(device, fmt, False, n, k, k_pad)
        chosen, timed = sweep_shape(time_config, ms, False, k_pad, step, candidates, fixed, counts, rings, wgmmas)
        for m in ms:
            x = xs[m]
            t_bf16 = timed_calls(m, lambda i: torch.nn.functional.linear(x, wb[i % bcopies]))
            t_op = timed_calls(m, lambda i: op(x, ws[i % copies]))
            t_best, cfg = timed[m][chosen]
            h = heuristic_config(n, k_pad, m, sms, False, fmt)
            t_h = timed_calls(m, lambda i: kernel(x, ws[i % copies], None, h))
            bytes_ = n * k * bpw + m * k * 2 + m * n * 2
            report["sweep"].append({
                "format": fmt, "n": n, "k": k, "m": m, "bf16_us": t_bf16 * 1e6, "op_us": t_op * 1e6,
                "best_us": t_best * 1e6, "best_cfg": cfg.__dict__, "heuristic_us": t_h * 1e6,
                "heuristic_cfg": h.__dict__, "best_gbps": bytes_ / t_best / 1e9, "speedup_best": t_bf16 / t_best,
                "speedup_heuristic": t_bf16 / t_h, "speedup_op": t_bf16 / t_op,
                "slices_us": {str(sl): tc[0] * 1e6 for sl, tc in sorted(timed[m].items())}, "sweep": rows[m],
                **norm_us(timed_calls, m, after_norm)})
            print(f"{fmt} {n}x{k} m={m}: bf16 {t_bf16*1e6:.1f} op {t_op*1e6:.1f} mma best {t_best*1e6:.1f} {cfg} "
                  f"(slices {chosen} of {sorted(timed[m])}) heur {t_h*1e6:.1f} -> {t_bf16/t_best:.2f}x "
                  f"({bytes_/t_best/1e9:.0f} GB/s)", flush=True)
        Path(report["out"]).write_text(json.dumps(report, indent=1))
        ws = wb = None  # this shape's weights freed before the next one's are made
        torch.cuda.empty_cache()
    for n, k in gated_shapes:  # gate and up, each n x k
        copies = max(2, int(ROTATE_BYTES // (2 * n * k * bpw)))
        gws = []
        for _ in range(copies):
            if fmt == "nvfp4":
                g, u = random_nvfp4(n, k, device), random_nvfp4(n, k, device)
                gws.append(prepack_nvfp4_gated(g, NVFP4Weight(u.packed, u.block_scale, g.global_scale)))
            else:
                gws.append(prepack_fp8_gated(random_fp8(n, k, device), random_fp8(n, k, device)))
        wb = [torch.randn(2 * n, k, device=device, dtype=torch.bfloat16) for _ in range(4)]
        k_pad = gws[0].codes.shape[1] * (8 if fmt == "nvfp4" else 4)
        xs = {m: torch.randn(m, k, device=device, dtype=torch.bfloat16) for m in ms}
        timed_calls = in_context(xs, after_norm)

        def time_gated(cfg, m):
            try:
                return timed_calls(m, lambda i: kernel(xs[m], gws[i % copies], None, cfg))
            except ValueError:
                return None

        fixed = 0 if ms[0] == 1 and not keep_slices else table_slices(device, fmt, True, n, k, k_pad)
        chosen, timed = sweep_shape(time_gated, ms, True, k_pad, step, candidates, fixed, counts, rings, wgmmas)
        for m in ms:
            x = xs[m]
            t_bf16 = timed_calls(m, lambda i: torch.nn.functional.linear(x, wb[i % 4]))
            t_best, cfg = timed[m][chosen]
            report["gated"].append({"format": fmt, "n": n, "k": k, "m": m, "bf16_us": t_bf16 * 1e6,
                                    "best_us": t_best * 1e6, "best_cfg": cfg.__dict__, "speedup": t_bf16 / t_best,
                                    "slices_us": {str(sl): tc[0] * 1e6 for sl, tc in sorted(timed[m].items())},
                                    **norm_us(timed_calls, m, after_norm)})
            print(f"{fmt} gated 2x{n}x{k} m={m}: bf16 {t_bf16*1e6:.1f} mma {t_best*1e6:.1f} {cfg} "
                  f"(slices {chosen} of {sorted(timed[m])})", flush=True)
        Path(report["out"]).write_text(json.dumps(report, indent=1))
        gws = wb = None
        torch.cuda.empty_cache()


def in_context(xs: dict, after_norm: bool):
    """``timed(m, calls)``: seconds per call of ``calls`` (graph_seconds), each behind the norm that writes ``xs[m]``
    with ``after_norm``; ``timed(m, None)`` the norm's chain alone."""
    norms = behind_norm(xs) if after_norm else {}

    def timed(m, calls):
        if not after_norm:
            return graph_seconds(calls)
        norm = norms[m]
        return graph_seconds(lambda i: (norm(), calls(i) if calls is not None else None))
    return timed


def norm_us(timed_calls, m: int, after_norm: bool) -> dict:
    """``{"norm_us": ...}``: the norm's chain alone, included in every time of an ``--after-norm`` sweep."""
    return {"norm_us": timed_calls(m, None) * 1e6} if after_norm else {}


def table_lines(path: str) -> list[str]:
    """A sweep file's best configs as a table file in the shape of ``dispatch/tables/*.json`` (and of an
    ``ANYFP4_MMA_TABLE`` file), one entry per line, named fields: its entries merge into a built-in table."""
    report = json.loads(Path(path).read_text())
    lines = ["{", f'  "sm": {int(report["sm"])},', f'  "sources": [{json.dumps(str(path))}],']
    for key, rows in (("sweep", report.get("sweep", [])), ("gated", report.get("gated", []))):
        entries = [json.dumps({"format": r["format"], "k": r["k"], "n": r["n"], "m": r["m"],
                               "best_cfg": {f: r["best_cfg"][f] for f in ("mt", "warps", "split_k", "depth", "kw",
                                                                            "shared_ring", "wgmma")
                                            if r["best_cfg"].get(f)}})
                   for r in sorted(rows, key=lambda r: (r["format"], r["k"], r["n"], r["m"]))]
        lines += [f'  "{key}": [', *[f"    {e}," for e in entries[:-1]], *[f"    {e}" for e in entries[-1:]],
                  "  ]," if key == "sweep" else "  ]"]
    return lines + ["}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="mma_sweep.json")
    ap.add_argument("--print-table", metavar="SWEEP_JSON", help="print a sweep file's best configs as launch-table "
                                                                "entries and exit (no GPU needed)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--formats", nargs="+", default=["nvfp4", "fp8"], choices=list(FORMATS))
    ap.add_argument("--shapes", nargs="*", metavar="NxK",
                    help="plain shapes to sweep (not given: PERF.md's; given with none named: no plain layer)")
    ap.add_argument("--gated", nargs="*", metavar="NxK", default=["14336x4096"],
                    help="gated shapes (gate = up = N x K); none named: no gated layer")
    ap.add_argument("--ms", nargs="+", type=int, help="M values (default 1 2 4 8 16 32)")
    ap.add_argument("--after-norm", action="store_true", help="time every call behind an add + RMSNorm kernel that "
                                                              "writes its input, as in a decode step")
    ap.add_argument("--keep-slices", action="store_true", help="sweep M = 1 too at the launch table's K-slice count "
                                                               "(its rows keep their bits)")
    ap.add_argument("--slice-candidates", type=int, default=2, help="the fastest K-slice counts of M = 1 that every "
                                                                     "other M is swept at; the one best over all M "
                                                                     "is kept (default 2)")
    ap.add_argument("--slice-counts", nargs="+", type=int, default=list(SLICE_COUNTS),
                    help="the K-slice counts M = 1 is swept over (any count: a count that is not a power of two runs "
                         "as split-K alone, e.g. 3 6 12 24 to fill a GPU's waves of blocks)")
    ap.add_argument("--shared-ring", action="store_true", help="sweep shared-memory rings (MMAConfig.shared_ring) too")
    ap.add_argument("--wgmma", action="store_true", help="sweep warpgroup mmas (MMAConfig.wgmma 1 and 2) too")
    args = ap.parse_args()
    if args.print_table:
        print("\n".join(table_lines(args.print_table)))
        return
    parse = lambda specs: [tuple(int(v) for v in s.lower().split("x")) for s in specs]  # noqa: E731
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    report = {"device": torch.cuda.get_device_name(), "sm": props.major * 10 + props.minor,
              "torch": torch.__version__, "sweep": [], "gated": [], "out": args.out}
    t0 = time.time()
    failures, results = [], []
    if not args.skip_check:
        check(device, failures, results)
    report["correctness"] = {"cases": len(results), "failures": failures, "results": results}
    report["copy_tbps"] = copy_bandwidth(device) / 1e12
    print(f"copy {report['copy_tbps']:.2f} TB/s", flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    if not args.skip_sweep:
        for fmt in args.formats:
            shapes = None if args.shapes is None else parse(args.shapes)
            sweep(device, report, args.quick, fmt, shapes, parse(args.gated), args.ms,
                  args.slice_candidates, args.after_norm, args.keep_slices, tuple(args.slice_counts),
                  (0, 1) if args.shared_ring else (0,), (0, 1, 2) if args.wgmma else (0,))
    report["seconds"] = time.time() - t0
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
