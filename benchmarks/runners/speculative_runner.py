"""Speculative decoding on one GPU, in one process: greedy tokens/s with and without prompt-lookup
drafting, acceptance length, the SHA-256 of both texts, and the verify-pass time per M = 1..8.

- ``--arch`` (default llama-3.1-8b): a random-weight NVFP4 model on a prompt that repeats a 16-token
  chunk (what prompt lookup feeds on), on every decode-kernel path (``PATHS``): the kernels chosen by
  default (CUDA), the CUDA kernel's sm_75 and sm_70 variants with fp16 activations (this GPU dispatched as a
  T4 / V100, the variant's source compiled for it), and the Triton kernels with the activation block-pack off
  and on, where speculation must refuse. Random weights do not continue the repetition, so acceptance there
  says nothing about real text; the speed of a verify pass does.
- ``--checkpoint DIR``: a real checkpoint (e.g. SmolLM2-135M-Instruct NVFP4) on a summarization prompt
  in its chat template, k = 1..7: acceptance and speed-up on real text.

    PYTHONPATH=src python benchmarks/runners/speculative_runner.py --out spec.json [--checkpoint DIR] [--skip-random]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

import torch

from anyfp4.bench.model import verify_pass_ms
from anyfp4.runtime.generate import SamplingParams, forget_decode_graphs, generate
from anyfp4.runtime.speculative import generate_speculative

PASSAGE = (
    "The city council met on Tuesday evening to discuss the future of the old railway station. The station "
    "closed in 1987, and since then the building has stood empty at the edge of the market square. Three "
    "proposals were presented. The first, from a group of local artists, would turn the station into studios "
    "and a small gallery, paid for by a mix of rent and grants. The second, from a housing association, would "
    "convert the upper floors into forty affordable flats and keep the ground floor as a public hall. The third, "
    "from a supermarket chain, would demolish the station and build a new store with a car park. Residents who "
    "spoke at the meeting were divided. Many said the station is part of the town's history and should not be "
    "demolished. Others said the town needs affordable flats more than anything else. The supermarket's "
    "representative argued that the new store would bring two hundred jobs. The council will vote on the "
    "proposals next month, after a public consultation that runs until the end of March."
)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _sha(tokens) -> str:
    return hashlib.sha256(repr(list(tokens)).encode()).hexdigest()


def _timed(fn):
    fn()  # warm-up: kernels compiled, a CUDA graph captured for every verify size this prompt meets
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t0


def compare_on_prompt(model, prompt: list[int], params: SamplingParams, ks) -> dict:
    """Plain greedy decoding and speculative decoding with each k in ``ks`` on one prompt, timed
    end to end (prefill included in both)."""
    plain, t_plain = _timed(lambda: generate(model, [prompt], params)[0])
    report = {"prompt_tokens": len(prompt), "new_tokens": len(plain), "plain_tok_s": len(plain) / t_plain,
              "plain_sha256": _sha(plain), "k": {}}
    for k in ks:
        (spec, stats), t = _timed(lambda k=k: generate_speculative(model, prompt, params, k))
        report["k"][k] = {"acceptance_length": stats.acceptance_length, "verify_steps": stats.verify_steps,
                          "tokens_per_verify_step": (len(spec) - 1) / max(stats.verify_steps, 1),
                          "tok_s": len(spec) / t, "speedup": (len(spec) / t) / report["plain_tok_s"],
                          "sha256": _sha(spec), "same_text": spec == plain}
        r = report["k"][k]
        print(f"  k={k}: acceptance {r['acceptance_length']:.2f}, {r['tok_s']:.1f} tok/s vs "
              f"{report['plain_tok_s']:.1f} plain ({r['speedup']:.2f}x), same text: {r['same_text']}", flush=True)
    return report


# name -> (ANYFP4_KERNELS, ANYFP4_ACT_PACK, activations, the (sm, multiprocessors) dispatched as, k values)
PATHS = {
    "default": ("auto", "auto", torch.bfloat16, None, range(1, 8)),
    "cuda_sm75_variant": ("cuda", "auto", torch.float16, (75, 40), (1, 4, 7)),
    "cuda_sm70_variant": ("cuda", "auto", torch.float16, (70, 80), (1, 4, 7)),
    "triton_pack0": ("triton", "0", torch.bfloat16, None, (4,)),
    "triton_pack1": ("triton", "1", torch.bfloat16, None, (4,)),
}


@contextlib.contextmanager
def dispatched_as(arch):
    """This GPU taken for an sm_``arch[0]`` one with ``arch[1]`` multiprocessors (and, for sm_70, CUDA 12's NVRTC):
    that architecture's dispatch and launch heuristics, the CUDA kernel's variant for it compiled for this GPU
    (mma.sync m8n8k4 and m16n8k8 are valid on sm_80+)."""
    if arch is None:
        yield
        return
    from anyfp4.kernels import device
    from anyfp4.kernels.cuda import nvrtc, weight_mma

    saved = device.device_arch, weight_mma.device_arch, nvrtc.version
    device.device_arch = weight_mma.device_arch = lambda index=None: arch
    nvrtc.version = lambda: (12, 9)
    try:
        yield
    finally:
        device.device_arch, weight_mma.device_arch, nvrtc.version = saved


def random_weight_runs(arch: str, gen_len: int, report: dict, save, paths) -> None:
    from anyfp4.bench.random_model import random_model

    models = {}
    chunk = None
    for name in paths:
        kernels, pack, dtype, as_arch, ks = PATHS[name]
        if dtype not in models:
            models.clear()  # one model on the GPU at a time
            torch.cuda.empty_cache()
            models[dtype] = random_model(arch, "nvfp4", torch.device("cuda"), dtype, progress=False)
        model = models[dtype]
        if chunk is None:
            chunk = torch.randint(0, model.args.vocab_size, (16,), generator=torch.Generator().manual_seed(0)).tolist()
        prompt = (chunk * 32)[:512]
        os.environ["ANYFP4_KERNELS"], os.environ["ANYFP4_ACT_PACK"] = kernels, pack
        forget_decode_graphs(model)
        print(f"{arch} nvfp4 {str(dtype).replace('torch.', '')}, kernels {name}:", flush=True)
        with dispatched_as(as_arch):
            try:
                r = compare_on_prompt(model, prompt, SamplingParams(max_new_tokens=gen_len), ks)
            except NotImplementedError as e:  # speculation refuses a path whose rows depend on M
                plain, t_plain = _timed(lambda: generate(model, [prompt], SamplingParams(max_new_tokens=gen_len))[0])
                r = {"prompt_tokens": len(prompt), "new_tokens": len(plain), "plain_tok_s": len(plain) / t_plain,
                     "plain_sha256": _sha(plain), "speculation_refused": str(e)}
                print(f"  speculation refused: {e}", flush=True)
            r["verify_ms"] = verify_pass_ms(model)
        r["dtype"], r["dispatched_as_sm"] = str(dtype), as_arch[0] if as_arch else None
        v = r["verify_ms"]
        print("  verify ms per M: " + " ".join(f"{m}:{t:.3f}({t / v[1]:.2f}x)" for m, t in v.items()), flush=True)
        report["random"][name] = r
        save()
        forget_decode_graphs(model)
    os.environ["ANYFP4_KERNELS"], os.environ["ANYFP4_ACT_PACK"] = "auto", "auto"


def checkpoint_runs(path: str, gen_len: int, report: dict, save) -> None:
    from transformers import AutoTokenizer

    from anyfp4.runtime.loader import load_model

    on_gpu = torch.cuda.is_available()
    model, _ = load_model(path, "cuda" if on_gpu else "cpu", torch.bfloat16 if on_gpu else torch.float32,
                          progress=False)
    tok = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "user", "content": "Summarize the following report in a few sentences.\n\n" + PASSAGE}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
        prompt = prompt["input_ids"]
    stops = tuple(t for t in {tok.eos_token_id} if t is not None)
    params = SamplingParams(max_new_tokens=gen_len, stop_token_ids=stops)
    print(f"{path}: summarization prompt of {len(prompt)} tokens", flush=True)
    r = compare_on_prompt(model, list(prompt), params, range(1, 8))
    plain = generate(model, [list(prompt)], params)[0]
    r["text"] = tok.decode(plain, skip_special_tokens=True)
    if model.device.type == "cuda":
        r["verify_ms"] = verify_pass_ms(model)
    report["checkpoint"] = {"path": path, "dtype": str(model.dtype), **r}
    save()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="spec.json")
    ap.add_argument("--arch", default="llama-3.1-8b")
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--checkpoint", help="a real checkpoint to run on a summarization prompt")
    ap.add_argument("--skip-random", action="store_true")
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS),
                    help="the decode-kernel paths of the random-weight runs")
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "arch": args.arch, "gen_len": args.gen_len, "random": {}}
    save = lambda: Path(args.out).write_text(json.dumps(report, indent=1))  # noqa: E731
    if not args.skip_random:
        random_weight_runs(args.arch, args.gen_len, report, save, args.paths)
    if args.checkpoint:
        checkpoint_runs(args.checkpoint, 256, report, save)
    save()


if __name__ == "__main__":
    main()
