"""CPU speed of the quantized path, one run, the alternatives side by side (no GPU needed).

    PYTHONPATH=src python benchmarks/runners/cpu_smollm2.py --out benchmarks/results/cpu_smollm2.json

1. ``anyfp4 bench --random-weights smollm2-135m`` for nvfp4, fp8 and bf16 (the bf16 model runs in float32 on the
   CPU, like the quantized ones): decode tok/s and the ratio to bf16.
2. The SmolLM2-135M-Instruct NVFP4 checkpoint of ``anyfp4 demo``: ``anyfp4 generate --chat`` of 24 tokens, wall
   time of the whole command (load included), against transformers generating 24 tokens from the same weights
   dequantized to float32 (``CheckpointReader.dequantize``), also timed from the start of its load; both greedy,
   and whether their texts agree.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "What is the capital of France? Answer in one sentence."
TOKENS = 24


def run_bench(fmt: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "anyfp4", "bench", "--random-weights", "smollm2-135m", "--format",
                          fmt, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def time_anyfp4_generate(ckpt: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "anyfp4", "generate", str(ckpt), "--chat", "--prompt", PROMPT,
                          "--max-tokens", str(TOKENS), "--device", "cpu"], capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, out.stdout.strip()


TRANSFORMERS_RUN = r"""
import sys, time, torch
t0 = time.perf_counter()
from transformers import AutoTokenizer, LlamaForCausalLM
from anyfp4.checkpoint.reader import CheckpointReader
bf16, ckpt, prompt, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
model = LlamaForCausalLM.from_pretrained(bf16, dtype=torch.float32)
reader = CheckpointReader(ckpt)
sd = model.state_dict()
with torch.no_grad():
    for layer in reader.layers:
        if layer.name + ".weight" in sd:
            sd[layer.name + ".weight"].copy_(reader.dequantize(layer))
tok = AutoTokenizer.from_pretrained(ckpt)
ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt")
ids = ids["input_ids"] if hasattr(ids, "keys") else ids
out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
print(time.perf_counter() - t0)
print(text.strip())
"""


def time_transformers(bf16: Path, ckpt: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", TRANSFORMERS_RUN, str(bf16), str(ckpt), PROMPT, str(TOKENS)],
                         capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, out.stdout.strip().split("\n", 1)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="cpu_smollm2.json")
    args = ap.parse_args()
    from anyfp4.demo import smollm2_bf16, smollm2_quantized

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"cpu": platform.processor() or platform.machine(), "commit": commit,
              "date": time.strftime("%Y-%m-%d"), "bench": {}, "generate": {}}
    for fmt in ("bf16", "nvfp4", "fp8"):
        r = run_bench(fmt)
        report["bench"][fmt] = {"decode_tok_s": r["decode_tok_s"], "prefill_tok_s": r["prefill_tok_s"]}
        print(f"bench smollm2-135m {fmt}: decode {r['decode_tok_s']:.2f} tok/s, prefill {r['prefill_tok_s']:.1f}")
    for fmt in ("nvfp4", "fp8"):
        ratio = report["bench"][fmt]["decode_tok_s"] / report["bench"]["bf16"]["decode_tok_s"]
        report["bench"][fmt]["x_bf16"] = ratio
        print(f"  {fmt} / bf16 decode: {ratio:.2f}x")
    bf16, ckpt = smollm2_bf16(progress=False), smollm2_quantized("nvfp4", progress=False)
    t_ours, text_ours = time_anyfp4_generate(ckpt)
    t_hf, text_hf = time_transformers(bf16, ckpt)
    report["generate"] = {"tokens": TOKENS, "anyfp4_s": t_ours, "transformers_fp32_dequantized_s": t_hf,
                          "anyfp4_text": text_ours, "transformers_text": text_hf}
    print(f"generate 24 tokens (chat), load included: anyfp4 {t_ours:.1f} s, transformers (dequantized fp32) "
          f"{t_hf:.1f} s\n  anyfp4: {text_ours!r}\n  transformers: {text_hf!r}")
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
