"""The decode scoreboard: anyfp4's NVFP4 / FP8 linears against bf16 and torch's own low-precision GEMMs, on one
GPU, in one run and by one method, plus end-to-end tok/s of a random Llama-3.1-8B through ``anyfp4 bench``.

    PYTHONPATH=src python benchmarks/kernels/scoreboard.py [--out benchmarks/results/decode_h200.json] [--png]
        [--shapes 6144x4096 28672x4096:gated ...] [--ms 1 8 32 ...] [--arms bf16 anyfp4-nvfp4 ...] [--skip-e2e]
        [--budget-s 450]
    PYTHONPATH=src python benchmarks/kernels/scoreboard.py --dry-run    # tiny shapes, smollm2-135m e2e; on a
        # machine without GPU a wall-clock timer and torch's CPU int4 kernel
    python benchmarks/plot.py benchmarks/results/decode_h200.json    # the PNG from a JSON (matplotlib)

Arms (``rows[].arm``), each timed as the median of CUDA-graph replays of R back-to-back calls that rotate
over random weight copies of >= ``ROTATE_BYTES`` together (several times the L2), bf16 activations:

- ``bf16``: ``F.linear`` (cuBLAS) on a bf16 weight.
- ``anyfp4-nvfp4`` / ``anyfp4-fp8``: ``torch.ops.anyfp4.nvfp4_linear`` / ``fp8_linear`` on prepacks (the op's own
  M dispatch: the CUDA decode kernel up to 32 rows, dequantize + cuBLAS above). A ``:gated`` shape (Llama's
  gate+up, N = 2 x 14336) runs ``nvfp4_gated`` / ``fp8_gated`` (silu(gate) * up, N / 2 columns out); every
  other arm times a plain N x K linear there.
- ``tinygemm-int4``: ``torch.ops.aten._weight_int4pack_mm`` (int4 weight-only, groups of 128, asymmetric bf16
  scales and zeros), checked once per shape against its dequantized weight; ``null`` with a note if the op is
  missing or wrong.
- ``scaled-mm-fp8``: ``torch._scaled_mm`` W8A8 on activations already in E4M3 (M padded to 16), per-tensor
  scales, bf16 out: a lower bound for native FP8 (activation quantization not timed).

``pct_copy`` = bytes the arm must read and write (its weight in its own format with scales, the M activation
rows in its input format, the bf16 output) / (time x device-to-device copy bandwidth of the same run). The
JSON is rewritten after every shape and every e2e run, so a run cut short keeps what it measured;
``--budget-s`` stops starting shapes (leaving time for e2e) and e2e runs once the budget is spent.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

ARMS = ("bf16", "anyfp4-nvfp4", "anyfp4-fp8", "tinygemm-int4", "scaled-mm-fp8")
SHAPES = ("6144x4096", "4096x4096", "28672x4096:gated", "14336x4096", "4096x14336", "28672x8192", "8704x5120",
          "5120x1536", "62080x5120")
MS = (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096)
DRY_SHAPES, DRY_MS = ("256x256", "512x256:gated"), (1, 4, 64)
ROTATE_BYTES = 256 * 1024**2  # >= 4x the H200's 60 MB L2 per arm
DRY_ROTATE_BYTES = 4 * 1024**2  # --dry-run: no measurement, a few copies
INT4_GROUP, INT4_INNER_K_TILES, INT4_TOL = 128, 8, 2e-2
SCALED_MM_ROW_ALIGN = 16  # torch._scaled_mm wants M a multiple of 16
E2E_MODEL, E2E_TIMEOUT_S, E2E_RESERVE_S = "llama-3.1-8b", 150, 200
# (--format and its options, --compare): two formats per process, the four of the scoreboard
E2E_PAIRS = ((("nvfp4",), "bf16"), (("nvfp4", "--quantized-lm-head"), "fp8"))
E2E_RUNS = ((1, 128, 64), (16, 128, 64), (1, 2048, 64))  # (batch, prompt length, tokens decoded)
DRY_E2E_RUNS = ((1, 16, 4), (2, 32, 4))


# -- bookkeeping: shapes, bytes, rows (pure, no GPU) --------------------------------------------------------

def parse_shape(text: str) -> tuple[int, int, bool]:
    """``NxK`` or ``NxK:gated`` (gate+up stacked: N counts both halves) -> (n, k, gated)."""
    dims, _, tag = text.partition(":")
    n, k = (int(v) for v in dims.lower().split("x"))
    if tag not in ("", "gated") or (tag and n % 2):
        raise argparse.ArgumentTypeError(f"expected NxK or NxK:gated (N even), got {text!r}")
    return n, k, bool(tag)


def weight_bytes(arm: str, n: int, k: int) -> int:
    """Bytes of an N x K weight in the arm's own format, scales included (unpadded, as a checkpoint holds it)."""
    return {"bf16": 2 * n * k,
            "anyfp4-nvfp4": n * k // 2 + n * k // 16 + 4,  # E2M1 codes, E4M3 block scales of 16, a global scale
            "anyfp4-fp8": n * k + 4 * n,  # E4M3 bytes, the prepack's float32 scale per row
            "tinygemm-int4": n * k // 2 + (k // INT4_GROUP) * n * 2 * 2,  # nibbles, bf16 scale + zero per group
            "scaled-mm-fp8": n * k + 8}[arm]  # E4M3 bytes, per-tensor weight and activation scales


def moved_bytes(arm: str, n: int, k: int, m: int, gated: bool = False) -> int:
    """Weight + M activation rows (E4M3 for scaled-mm, bf16 otherwise) + the bf16 output (N / 2 columns for
    anyfp4's gated op)."""
    act = m * k * (1 if arm == "scaled-mm-fp8" else 2)
    out_cols = n // 2 if gated and arm.startswith("anyfp4-") else n
    return weight_bytes(arm, n, k) + act + 2 * m * out_cols


def make_row(arm: str, n: int, k: int, m: int, seconds: float | None, copy_Bps: float | None, gated: bool = False,
             note: str | None = None) -> dict:
    us = seconds * 1e6 if seconds is not None else None
    pct = 100 * moved_bytes(arm, n, k, m, gated) / (seconds * copy_Bps) if seconds and copy_Bps else None
    row = {"arm": arm, "n": n, "k": k, "m": m, "us": us, "pct_copy": pct}
    if note:
        row["note"] = note
    return row


def copies_for(nbytes: int) -> int:
    """Weight copies to rotate over: together at least ``ROTATE_BYTES``, never fewer than two."""
    return max(2, math.ceil(ROTATE_BYTES / nbytes))


def timing_plan(m: int, copies: int) -> dict:
    """Calls per graph and replays: large M is compute-bound (milliseconds a call), so fewer of both; but at least
    one call per weight copy, so that the rotation a graph replays exceeds the L2 as ``copies_for`` meant."""
    reps, trials = (20, 7) if m <= 32 else (10, 7) if m <= 256 else (5, 5)
    return dict(reps=max(reps, copies), trials=trials)


def error_note(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:200]}"


# -- the arms: each builds its rotated weights and returns calls_for(m) -> calls(i) --------------------------

def bf16_arm(n, k, gated, device):
    copies = copies_for(weight_bytes("bf16", n, k))
    ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]

    def calls_for(m):
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        return lambda i: torch.nn.functional.linear(x, ws[i % copies])
    return calls_for, copies


def anyfp4_arm(fmt: str):
    def build(n, k, gated, device):
        import anyfp4.ops  # noqa: F401  (registers torch.ops.anyfp4)
        from anyfp4.bench.random_weights import random_fp8, random_nvfp4
        from anyfp4.formats.nvfp4 import NVFP4Weight
        from anyfp4.packing.fp8 import prepack_fp8, prepack_fp8_gated
        from anyfp4.packing.nvfp4 import prepack_nvfp4, prepack_nvfp4_gated

        half = n // 2 if gated else n

        def one():
            if fmt == "fp8":
                return prepack_fp8_gated(random_fp8(half, k, device), random_fp8(half, k, device)) if gated else \
                    prepack_fp8(random_fp8(n, k, device))
            if not gated:
                return prepack_nvfp4(random_nvfp4(n, k, device))
            gate, up = random_nvfp4(half, k, device), random_nvfp4(half, k, device)
            return prepack_nvfp4_gated(gate, NVFP4Weight(up.packed, up.block_scale, gate.global_scale))

        copies = copies_for(weight_bytes(f"anyfp4-{fmt}", n, k))
        ps = [one() for _ in range(copies)]
        if torch.device(device).type == "cuda":  # split-K counters exist before any graph capture
            from anyfp4.kernels.cuda.weight_mma import reserve_counters

            reserve_counters(torch.device(device))
        ops = torch.ops.anyfp4
        if fmt == "nvfp4":
            op = (lambda x, p: ops.nvfp4_gated(x, p.codes, p.scales, p.global_scale, p.up_offset, p.out_features,
                                               p.in_features)) if gated else \
                (lambda x, p: ops.nvfp4_linear(x, p.codes, p.scales, p.global_scale, None, p.out_features,
                                               p.in_features))
        else:
            op = (lambda x, p: ops.fp8_gated(x, p.codes, p.scales, p.up_offset, p.out_features, p.in_features)) \
                if gated else (lambda x, p: ops.fp8_linear(x, p.codes, p.scales, None, p.out_features, p.in_features))

        def calls_for(m):
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            return lambda i: op(x, ps[i % copies])
        calls_for.prepacks = ps  # for probes that time other launchers on the same weights
        return calls_for, copies
    return build


def int4_weight(n: int, k: int, device, high_nibble_even: bool = True):
    """Random tinygemm int4 weight: codes q (N, K) in 0..15, ``scales_and_zeros`` (K / 128, N, 2) bf16 and the
    packed weight; W = (q - 8) * scale + zero. CUDA packs from two codes per byte, (N, K / 2) uint8; torch's CPU
    build of the kernel (--dry-run) from the codes as int32."""
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, device=device)
    scales = torch.rand(k // INT4_GROUP, n, device=device) * 1e-3 + 5e-4
    zeros = (torch.rand(k // INT4_GROUP, n, device=device) - 0.5) * 1e-3  # small: the codes must dominate the check
    sz = torch.stack([scales, zeros], dim=-1).to(torch.bfloat16)
    if q.device.type == "cpu":
        return q, sz, torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.int(), INT4_INNER_K_TILES)
    even, odd = q[:, 0::2], q[:, 1::2]
    nibbles = (even << 4 | odd) if high_nibble_even else (odd << 4 | even)
    return q, sz, torch.ops.aten._convert_weight_to_int4pack(nibbles.contiguous(), INT4_INNER_K_TILES)


def int4_mm(x: torch.Tensor, w: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    op = torch.ops.aten._weight_int4pack_mm_for_cpu if x.device.type == "cpu" else torch.ops.aten._weight_int4pack_mm
    return op(x, w, INT4_GROUP, sz)


def int4_dequantized(q: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """(N, K) float32: (q - 8) * scale + zero, scale and zero of q's group of 128 k."""
    scale = sz[..., 0].float().t().repeat_interleave(INT4_GROUP, dim=1)
    zero = sz[..., 1].float().t().repeat_interleave(INT4_GROUP, dim=1)
    return (q.float() - 8) * scale + zero


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def tinygemm_arm(n, k, gated, device, checks: list):
    x = torch.randn(8, k, device=device, dtype=torch.bfloat16)
    errs = {}
    for high_even in (True, False):  # the documented packing first; the check decides
        q, sz, w = int4_weight(n, k, device, high_even)
        errs[high_even] = rel_err(int4_mm(x, w, sz), x.float() @ int4_dequantized(q, sz).t())
        del q, w
        if errs[high_even] < INT4_TOL:
            break
    ok = errs[high_even] < INT4_TOL
    checks.append({"arm": "tinygemm-int4", "n": n, "k": k, "rel_err": errs[high_even], "ok": ok,
                   "nibble_order": "codes unpacked (CPU)" if x.device.type == "cpu" else
                   "high nibble = even k" if high_even else "low nibble = even k"})
    if not ok:
        raise ValueError(f"wrong result: rel err {min(errs.values()):.2e} against the dequantized weight "
                         f"(tolerance {INT4_TOL}, both nibble orders)")
    copies = copies_for(weight_bytes("tinygemm-int4", n, k))
    ws = [int4_weight(n, k, device, high_even)[1:] for _ in range(copies)]

    def calls_for(m):
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        return lambda i: int4_mm(x, ws[i % copies][1], ws[i % copies][0])
    return calls_for, copies


def scaled_mm_arm(n, k, gated, device):
    from anyfp4.bench.random_weights import random_fp8

    copies = copies_for(weight_bytes("scaled-mm-fp8", n, k))
    ws = [random_fp8(n, k, device).weight for _ in range(copies)]  # (N, K) row-major: .t() is column-major
    one = torch.ones((), device=device)

    def calls_for(m):
        rows = -(-m // SCALED_MM_ROW_ALIGN) * SCALED_MM_ROW_ALIGN
        x8 = torch.randn(rows, k, device=device).to(torch.float8_e4m3fn)
        return lambda i: torch._scaled_mm(x8, ws[i % copies].t(), one, one, out_dtype=torch.bfloat16)
    return calls_for, copies


BUILDERS = {"bf16": bf16_arm, "anyfp4-nvfp4": anyfp4_arm("nvfp4"), "anyfp4-fp8": anyfp4_arm("fp8"),
            "scaled-mm-fp8": scaled_mm_arm}


def eager_seconds(calls, reps: int = 20, trials: int = 7) -> float:
    """Wall-clock stand-in for graph_seconds where there is no GPU (--dry-run): median of ``trials`` rounds."""
    for i in range(2):
        calls(i)
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        for i in range(reps):
            calls(i)
        times.append((time.perf_counter() - t0) / reps)
    return sorted(times)[len(times) // 2]


def bench_shape(shape: str, arms, ms, device, timer, copy_Bps, checks: list) -> list[dict]:
    """Rows of every arm and M for one shape; an arm that cannot be built or run gets null rows with a note."""
    n, k, gated = parse_shape(shape)
    rows = []
    for arm in arms:
        note, copies = None, 0
        try:
            calls_for, copies = tinygemm_arm(n, k, gated, device, checks) if arm == "tinygemm-int4" else \
                BUILDERS[arm](n, k, gated, device)
        except Exception as e:  # op missing on this torch / GPU, or wrong: recorded, not fatal
            calls_for, note = None, error_note(e)
        for m in ms:
            seconds = None
            if calls_for is not None and note is None:
                try:
                    seconds = timer(calls_for(m), **timing_plan(m, copies))
                except Exception as e:
                    note = error_note(e)  # the remaining M of this arm are skipped with the same note
            rows.append(make_row(arm, n, k, m, seconds, copy_Bps, gated, note if seconds is None else None))
        del calls_for
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def shape_table(shape: str, rows: list[dict]) -> str:
    """us, % of copy and x bf16 per arm (columns) and M (lines)."""
    n, k, gated = parse_shape(shape)
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    by = {(r["arm"], r["m"]): r for r in rows}
    lines = [f"{n}x{k}{' (gate+up: anyfp4 gated op)' if gated else ''}",
             "     M " + "".join(f"{a:>26}" for a in arms)]
    for m in dict.fromkeys(r["m"] for r in rows):
        base = by.get(("bf16", m), {}).get("us")
        cells = []
        for a in arms:
            r = by[(a, m)]
            if r["us"] is None:
                cells.append(f"{'-':>26}")
                continue
            pct = f"{r['pct_copy']:3.0f}%" if r["pct_copy"] is not None else "  -%"
            x = f"x{base / r['us']:5.2f}" if base else "     -"
            cells.append(f"{r['us']:11.1f} us {pct} {x}")
        lines.append(f"{m:>6} " + "".join(cells))
    notes = {r["arm"]: r["note"] for r in rows if r.get("note")}
    lines += [f"  {a}: {note}" for a, note in notes.items()]
    return "\n".join(lines)


# -- end to end: anyfp4 bench in subprocesses ----------------------------------------------------------------

def e2e_jobs(dry_run: bool = False) -> list[dict]:
    """One ``anyfp4 bench`` command per format pair and (batch, prompt length)."""
    model = "smollm2-135m" if dry_run else E2E_MODEL  # the CLI's --device auto: the CPU where there is no GPU
    jobs = []
    for batch, prompt_len, gen_len in DRY_E2E_RUNS if dry_run else E2E_RUNS:
        for fmt_args, other in E2E_PAIRS:
            argv = [sys.executable, "-m", "anyfp4", "bench", "--random-weights", model, "--format", *fmt_args,
                    "--compare", other, "--batch", str(batch), "--prompt-len", str(prompt_len), "--gen-len",
                    str(gen_len), "--json"]
            formats = [fmt_args[0] + ("+lm_head" if "--quantized-lm-head" in fmt_args else ""), other]
            jobs.append({"argv": argv, "formats": formats, "model": model, "batch": batch, "prompt_len": prompt_len})
    return jobs


def e2e_rows(job: dict, stdout: str | None, error: str | None) -> list[dict]:
    """Rows of one job from ``anyfp4 bench --json`` output (a list with --compare); null rows with the error."""
    results = {}
    if stdout is not None and error is None:
        try:
            parsed = json.loads(stdout[min(i for i in (stdout.find("["), stdout.find("{")) if i >= 0):])
            results = {r["model"].rsplit(":", 1)[-1]: r for r in (parsed if isinstance(parsed, list) else [parsed])}
        except (ValueError, KeyError, TypeError) as e:
            error = f"unreadable output: {error_note(e)}"
    rows = []
    for fmt in job["formats"]:
        r = results.get(fmt)
        row = {"model": job["model"], "format": fmt, "batch": job["batch"], "prompt_len": job["prompt_len"],
               "decode_tok_s": r["decode_tok_s"] if r else None, "prefill_tok_s": r["prefill_tok_s"] if r else None}
        if r is None:
            row["error"] = error or "no result for this format"
        rows.append(row)
    return rows


def run_job(job: dict, timeout_s: float) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why it failed). The child imports anyfp4 from this checkout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    try:
        p = subprocess.run(job["argv"], capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s"
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or [""])[-1]
        return None, f"exit code {p.returncode}: {tail[:300]}"
    return p.stdout, None


# -- the report ----------------------------------------------------------------------------------------------

def commit() -> str | None:
    """``ANYFP4_COMMIT`` where set (a copy of the tree whose git metadata is not its own), else git's HEAD."""
    if os.environ.get("ANYFP4_COMMIT"):
        return os.environ["ANYFP4_COMMIT"]
    try:
        p = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT, timeout=10)
        if p.returncode == 0 and p.stdout.strip():
            return p.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def new_report(gpu: str, copy_Bps: float | None, args) -> dict:
    return {"gpu": gpu, "date": time.strftime("%Y-%m-%d"), "commit": commit(), "torch": torch.__version__,
            "copy_bandwidth_Bps": copy_Bps, "shapes": list(args.shapes), "ms": list(args.ms), "rows": [],
            "checks": [], "e2e": [], "skipped": []}


def save(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


def png(report: dict, path: Path) -> str:
    """x bf16 vs M, a panel per shape, a line per arm, drawn by ``benchmarks/plot.py`` in a subprocess; a note where
    matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        return "png skipped: matplotlib is not installed (python benchmarks/plot.py JSON draws it later)"
    data = path.with_suffix(".plot.json")
    save(report, data)
    try:
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks/plot.py"), str(data), str(path)],
                           capture_output=True, text=True, timeout=120)
    finally:
        data.unlink(missing_ok=True)
    return f"png: {path}" if p.returncode == 0 else f"png failed: {p.stderr.strip()[-300:]}"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/decode_h200.json", help="the JSON "
                    "(default: benchmarks/results/decode_h200.json)")
    ap.add_argument("--shapes", nargs="+", help=f"NxK or NxK:gated (default: {' '.join(SHAPES)})")
    ap.add_argument("--ms", type=int, nargs="+", help=f"activation rows (default: {' '.join(map(str, MS))})")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="default: all")
    ap.add_argument("--skip-e2e", action="store_true", help="no anyfp4 bench subprocesses")
    ap.add_argument("--png", nargs="?", const="", help="also a PNG (default path: --out with .png)")
    ap.add_argument("--budget-s", type=float, default=450, help=f"seconds: no shape starts after the budget less "
                    f"{E2E_RESERVE_S} s (unless --skip-e2e), no e2e run after it (default: 450)")
    ap.add_argument("--dry-run", action="store_true", help="without a GPU: tiny shapes, a wall-clock timer, "
                    "smollm2-135m e2e on the CPU")
    args = ap.parse_args(argv)
    args.shapes = args.shapes or list(DRY_SHAPES if args.dry_run else SHAPES)
    args.ms = args.ms or list(DRY_MS if args.dry_run else MS)
    for s in args.shapes:
        try:
            parse_shape(s)
        except (ValueError, argparse.ArgumentTypeError) as e:
            ap.error(f"--shapes: {e}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    global ROTATE_BYTES
    t0 = time.monotonic()
    cuda = torch.cuda.is_available()
    if args.dry_run:
        ROTATE_BYTES = DRY_ROTATE_BYTES
    if not cuda and not args.dry_run:
        print("no CUDA GPU: run with --dry-run to exercise the script on the CPU", file=sys.stderr)
        return 2
    from anyfp4.bench.timing import copy_bandwidth, graph_seconds

    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    copy_Bps = copy_bandwidth(device)
    report = new_report(torch.cuda.get_device_name(device) if cuda else "cpu", copy_Bps, args)
    timer = graph_seconds if cuda else eager_seconds
    print(f"{report['gpu']}: copy bandwidth " + (f"{copy_Bps / 1e12:.2f} TB/s" if copy_Bps else "n/a"), flush=True)
    shape_deadline = args.budget_s - (0 if args.skip_e2e else E2E_RESERVE_S)
    for shape in args.shapes:
        if time.monotonic() - t0 > shape_deadline:
            report["skipped"].append(f"shape {shape}: time budget")
            continue
        rows = bench_shape(shape, args.arms, args.ms, device, timer, copy_Bps, report["checks"])
        report["rows"] += rows
        save(report, args.out)
        print(shape_table(shape, rows) + f"\n  [{time.monotonic() - t0:.0f} s]", flush=True)
    for job in [] if args.skip_e2e else e2e_jobs(args.dry_run):
        left = args.budget_s - (time.monotonic() - t0)
        label = f"{'/'.join(job['formats'])} batch {job['batch']} prompt {job['prompt_len']}"
        if left < 30:
            report["skipped"].append(f"e2e {label}: time budget")
            continue
        rows = e2e_rows(job, *run_job(job, min(E2E_TIMEOUT_S, left)))
        report["e2e"] += rows
        save(report, args.out)
        print(f"e2e {label}: " + ", ".join(
            f"{r['format']} decode {r['decode_tok_s']:.1f} tok/s prefill {r['prefill_tok_s']:.0f} tok/s"
            if r["decode_tok_s"] is not None else f"{r['format']} {r['error']}" for r in rows)
              + f"  [{time.monotonic() - t0:.0f} s]", flush=True)
    if args.png is not None:
        report["png"] = png(report, Path(args.png) if args.png else args.out.with_suffix(".png"))
        print(report["png"])
    save(report, args.out)
    print(f"wrote {args.out} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
