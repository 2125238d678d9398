"""Speed-up over bf16 vs M from a benchmark JSON (needs matplotlib): one line per shape for the nvfp4_linear /
fp8_linear reports, one panel per shape with a line per arm for the decode scoreboard (kernels/scoreboard.py).

    python benchmarks/plot.py benchmarks/results/nvfp4_linear_h200.json
    python benchmarks/plot.py benchmarks/results/decode_h200.json
"""

import json
import sys
from pathlib import Path


def speedups(rows: list[dict]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Scoreboard rows -> {"NxK": {arm: [(m, bf16 us / arm us)]}} for every row with a time and a bf16 row of the
    same n, k, m."""
    bf16 = {(r["n"], r["k"], r["m"]): r["us"] for r in rows if r["arm"] == "bf16" and r["us"]}
    out: dict[str, dict[str, list]] = {}
    for r in rows:
        base = bf16.get((r["n"], r["k"], r["m"]))
        if r["us"] and base:
            out.setdefault(f"{r['n']}x{r['k']}", {}).setdefault(r["arm"], []).append((r["m"], base / r["us"]))
    return out


def _style(ax, title: str, fontsize: float | None = None) -> None:
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (activation rows)")
    ax.set_ylabel("speed-up over bf16 F.linear")
    ax.set_title(title, fontsize=fontsize)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)


def _lines(ax, series: dict[str, list[tuple[int, float]]]) -> None:
    for name, pts in series.items():
        pts = sorted(pts)
        ax.plot([m for m, _ in pts], [s for _, s in pts], marker="o", label=name)


def draw(report: dict, title: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw = report.get("copy_bandwidth_Bps")
    title = f"{title}: {report['gpu']}" + (f", copy {bw / 1e12:.2f} TB/s" if bw else "")
    if "rows" in report:  # the scoreboard: a panel per shape
        panels = speedups(report["rows"])
        cols = min(3, max(1, len(panels)))
        lines = max(1, -(-len(panels) // cols))
        fig, axes = plt.subplots(lines, cols, figsize=(5 * cols, 3.6 * lines), squeeze=False)
        for ax, (shape, arms) in zip(axes.flat, panels.items()):
            _lines(ax, arms)
            _style(ax, shape, fontsize=10)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(title)
    else:
        shapes: dict[str, list] = {}
        for e in report["linear"]:
            shapes.setdefault(f"{e['n']}x{e['k']}", []).append((e["m"], e["speedup"]))
        fig, ax = plt.subplots(figsize=(8, 5))
        _lines(ax, shapes)
        _style(ax, title)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def main(path: str, out: str | None = None) -> None:
    """``python benchmarks/plot.py REPORT.json [OUT.png]`` (default: the report's name with .png)."""
    print(draw(json.loads(Path(path).read_text()), Path(path).stem, Path(out) if out else Path(path).with_suffix(".png")))


if __name__ == "__main__":
    main(*sys.argv[1:3])
