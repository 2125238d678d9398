"""Speed-up over bf16 vs M, one line per shape, from a benchmark JSON (needs matplotlib).

    python benchmarks/plot.py benchmarks/results/nvfp4_linear_h200.json
"""

import json
import sys
from pathlib import Path


def main(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(Path(path).read_text())
    shapes: dict[str, list] = {}
    for e in report["linear"]:
        shapes.setdefault(f"{e['n']}x{e['k']}", []).append((e["m"], e["speedup"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, pts in shapes.items():
        pts.sort()
        ax.plot([m for m, _ in pts], [s for _, s in pts], marker="o", label=name)
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (activation rows)")
    ax.set_ylabel("speed-up over bf16 F.linear")
    ax.set_title(f"{Path(path).stem}: {report['gpu']}, copy {report['copy_bandwidth_Bps'] / 1e12:.2f} TB/s")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
