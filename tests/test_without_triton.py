"""The CPU path needs no Triton (it is no dependency of anyfp4: CUDA builds of torch bring it): import, the ops,
a quantized model's generation, one and two tensor-parallel processes, with every ``import triton`` failing."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import torch

from anyfp4.checkpoint.writer import QuantizeOptions, TargetFormat, quantize_checkpoint
from anyfp4.runtime.generate import SamplingParams, generate
from anyfp4.runtime.loader import load_model
from helpers import TINY_LLAMA, write_float_checkpoint

PROMPTS = [[5, 6, 7, 8, 9], [1, 2, 3]]
CONFIG = dict(TINY_LLAMA, intermediate_size=128)  # 64 per rank: whole 16-element groups

RUN = textwrap.dedent("""
    import json, sys
    import torch
    import anyfp4.ops  # noqa: F401
    from anyfp4.runtime.generate import SamplingParams, generate
    from anyfp4.runtime.loader import load_model
    from anyfp4.parallel.model import generate_tp
    from anyfp4.formats.fp8 import quantize_fp8
    from anyfp4.packing.fp8 import prepack_fp8

    ckpt, prompts, port = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    params = SamplingParams(max_new_tokens=6)
    one = generate(model, prompts, params)
    two = generate_tp(ckpt, prompts, params, tp=2, port=port)
    # the opt-in W8A8 prefill (its CPU path is pure torch too)
    g = torch.Generator().manual_seed(0)
    p = prepack_fp8(quantize_fp8(torch.randn(64, 128, generator=g)))
    y = torch.ops.anyfp4.fp8_linear(torch.randn(40, 128, generator=g).bfloat16(), p.codes, p.scales, None, 64, 128,
                                    0, torch.tensor(0.02))
    print(json.dumps({"one": one, "two": two, "w8a8": y.float().sum().item(),
                      "triton": "triton" in sys.modules}))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cpu_path_runs_with_triton_unimportable(tmp_path):
    src = write_float_checkpoint(tmp_path / "src", CONFIG)
    ckpt = quantize_checkpoint(src, tmp_path / "q", QuantizeOptions(format=TargetFormat.MIXED, progress=False)).dst
    blocker = tmp_path / "no-triton" / "triton"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('triton is not installed (blocked by the test)')\n")
    path = [str(blocker.parent)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, ANYFP4_FP8_PREFILL="w8a8", PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run([sys.executable, "-c", RUN, str(ckpt), json.dumps(PROMPTS), str(free_port())],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    model, _ = load_model(ckpt, "cpu", torch.float32, progress=False)
    want = generate(model, PROMPTS, SamplingParams(max_new_tokens=6))
    assert got["one"] == want and got["two"] == want
    assert got["triton"] is False and got["w8a8"] != 0
