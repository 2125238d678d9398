"""The decode scoreboard's bookkeeping on the CPU: shapes, bytes per arm, rows, e2e commands and parsing, the JSON
it writes (with a fake timer); no GPU."""

import importlib.util
import json
import sys

import pytest
import torch

from helpers import load_script


@pytest.fixture(scope="module")
def sb():
    return load_script("kernels/scoreboard.py")


@pytest.fixture
def fake_timer(sb, monkeypatch):
    """Runs each rotation's first call once (so every arm really runs) and says 10 us."""
    def timer(calls, reps=20, trials=7):
        calls(0)
        return 1e-5

    monkeypatch.setattr(sb, "ROTATE_BYTES", sb.DRY_ROTATE_BYTES)
    monkeypatch.setattr(sb, "eager_seconds", timer)
    return timer


def test_shapes(sb):
    assert sb.parse_shape("28672x4096:gated") == (28672, 4096, True)
    assert sb.parse_shape("5120x1536") == (5120, 1536, False)
    assert [sb.parse_shape(s)[2] for s in sb.SHAPES].count(True) == 1
    for bad in ("4096", "4096x4096:fused", "4097x64:gated"):
        with pytest.raises(Exception):
            sb.parse_shape(bad)


def test_bytes_per_arm(sb):
    n = k = 4096
    assert sb.weight_bytes("bf16", n, k) == 2 * n * k
    assert sb.weight_bytes("anyfp4-nvfp4", n, k) == n * k * 9 // 16 + 4  # codes + block scales + global scale
    assert sb.weight_bytes("anyfp4-fp8", n, k) == n * k + 4 * n
    assert sb.weight_bytes("tinygemm-int4", n, k) == n * k // 2 + (k // 128) * n * 4
    assert sb.weight_bytes("scaled-mm-fp8", n, k) == n * k + 8
    m = 8
    assert sb.moved_bytes("bf16", n, k, m) == 2 * n * k + 2 * m * k + 2 * m * n
    assert sb.moved_bytes("scaled-mm-fp8", n, k, m) == n * k + 8 + m * k + 2 * m * n  # E4M3 activations
    # gate+up: anyfp4's gated op reads both halves and writes N / 2 columns; the other arms a plain N x K linear
    gated = sb.moved_bytes("anyfp4-fp8", 28672, k, m, gated=True)
    assert gated == 28672 * k + 4 * 28672 + 2 * m * k + 2 * m * 14336
    assert sb.moved_bytes("bf16", 28672, k, m, gated=True) == sb.moved_bytes("bf16", 28672, k, m)


def test_rows_and_copies(sb):
    row = sb.make_row("anyfp4-nvfp4", 4096, 4096, 1, 2e-6, 4e12)
    assert set(row) == {"arm", "n", "k", "m", "us", "pct_copy"}
    assert row["us"] == pytest.approx(2.0)
    assert row["pct_copy"] == pytest.approx(100 * sb.moved_bytes("anyfp4-nvfp4", 4096, 4096, 1) / (2e-6 * 4e12))
    missing = sb.make_row("tinygemm-int4", 4096, 4096, 1, None, 4e12, note="RuntimeError: no kernel")
    assert missing["us"] is None and missing["pct_copy"] is None and missing["note"].startswith("RuntimeError")
    assert sb.make_row("bf16", 64, 64, 1, 1e-6, None)["pct_copy"] is None  # no copy bandwidth on the CPU
    assert sb.copies_for(sb.ROTATE_BYTES * 10) == 2
    nbytes = sb.weight_bytes("anyfp4-nvfp4", 4096, 4096)
    assert sb.copies_for(nbytes) * nbytes >= sb.ROTATE_BYTES > (sb.copies_for(nbytes) - 1) * nbytes
    assert [sb.timing_plan(m, 2)["reps"] for m in (1, 32, 64, 4096)] == [20, 20, 10, 5]
    assert sb.timing_plan(4096, 58)["reps"] == 58  # every copy of the rotation is in the graph


def test_plot_speedups(sb, tmp_path):
    plot = load_script("plot.py")
    rows = [sb.make_row("bf16", 64, 32, 1, 4e-6, None), sb.make_row("anyfp4-fp8", 64, 32, 1, 2e-6, None),
            sb.make_row("tinygemm-int4", 64, 32, 1, None, None, note="missing")]
    assert plot.speedups(rows) == {"64x32": {"bf16": [(1, 1.0)], "anyfp4-fp8": [(1, 2.0)]}}
    note = sb.png({"gpu": "cpu", "rows": rows}, tmp_path / "board.png")
    assert note == f"png: {tmp_path / 'board.png'}" if importlib.util.find_spec("matplotlib") else \
        note.startswith("png skipped")


def test_int4_reference_matches_torch_cpu_kernel(sb):
    """The scales_and_zeros layout (K / 128, N, 2) and W = (q - 8) * scale + zero, against torch's own kernel."""
    torch.manual_seed(0)
    q, sz, w = sb.int4_weight(128, 256, "cpu")
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    assert sz.shape == (2, 128, 2) and sz.dtype == torch.bfloat16
    assert sb.rel_err(sb.int4_mm(x, w, sz), x.float() @ sb.int4_dequantized(q, sz).t()) < sb.INT4_TOL


def test_bench_shape_every_arm_on_the_cpu(sb, fake_timer):
    checks = []
    rows = sb.bench_shape("512x256:gated", sb.ARMS, [1, 64], torch.device("cpu"), fake_timer, 1e12, checks)
    assert [(r["arm"], r["m"]) for r in rows] == [(a, m) for a in sb.ARMS for m in (1, 64)]
    for r in rows:
        assert r["n"] == 512 and r["k"] == 256
        if r["us"] is not None:  # scaled_mm may be missing from a CPU build: then a note
            assert r["us"] == pytest.approx(10.0)
            assert r["pct_copy"] == pytest.approx(100 * sb.moved_bytes(r["arm"], 512, 256, r["m"], True) / 1e7)
        else:
            assert r["note"]
    assert all(r["us"] is not None for r in rows if r["arm"] != "scaled-mm-fp8")
    assert checks == [dict(checks[0], arm="tinygemm-int4", n=512, k=256, ok=True)]
    table = sb.shape_table("512x256:gated", rows)
    assert "gate+up" in table and "x 1.00" in table


def test_failing_arm_gives_null_rows(sb, fake_timer, monkeypatch):
    def broken(n, k, gated, device):
        raise RuntimeError("no such kernel\nsecond line")

    monkeypatch.setitem(sb.BUILDERS, "scaled-mm-fp8", broken)
    rows = sb.bench_shape("64x128", ["scaled-mm-fp8"], [1, 2], "cpu", fake_timer, None, [])
    assert [r["note"] for r in rows] == ["RuntimeError: no such kernel"] * 2
    assert all(r["us"] is None for r in rows)


def test_e2e_commands_use_real_cli_options(sb):
    from anyfp4.cli.parser import build_parser

    jobs = sb.e2e_jobs()
    formats = sorted({f for j in jobs for f in j["formats"]})
    assert formats == ["bf16", "fp8", "nvfp4", "nvfp4+lm_head"]
    assert sorted({(j["batch"], j["prompt_len"]) for j in jobs}) == [(1, 128), (1, 2048), (16, 128)]
    for job in jobs:
        assert job["argv"][:3] == [sys.executable, "-m", "anyfp4"]
        args = build_parser().parse_args(job["argv"][3:])
        assert args.random_weights == "llama-3.1-8b" and args.json and args.batch == job["batch"]
        assert args.prompt_len == job["prompt_len"] and args.compare == job["formats"][1]
        assert args.quantized_lm_head == (job["formats"][0] == "nvfp4+lm_head")


def test_e2e_rows(sb):
    job = sb.e2e_jobs()[1]  # nvfp4+lm_head / fp8
    out = json.dumps([{"model": "random:llama-3.1-8b:nvfp4+lm_head", "decode_tok_s": 300.0, "prefill_tok_s": 9e3},
                      {"model": "random:llama-3.1-8b:fp8", "decode_tok_s": 250.0, "prefill_tok_s": 8e3}])
    rows = sb.e2e_rows(job, "loading...\n" + out, None)
    assert [(r["format"], r["decode_tok_s"]) for r in rows] == [("nvfp4+lm_head", 300.0), ("fp8", 250.0)]
    assert set(rows[0]) == {"model", "format", "batch", "prompt_len", "decode_tok_s", "prefill_tok_s"}
    failed = sb.e2e_rows(job, None, "timed out after 150 s")
    assert [r["error"] for r in failed] == ["timed out after 150 s"] * 2 and failed[0]["decode_tok_s"] is None
    assert sb.e2e_rows(job, "no json here", None)[0]["error"].startswith("unreadable output")


def test_run_job_records_failures(sb):
    assert sb.run_job({"argv": [sys.executable, "-c", "import time; time.sleep(5)"]}, 0.5) == \
        (None, "timed out after 0 s")
    out, err = sb.run_job({"argv": [sys.executable, "-c", "import sys; sys.exit('boom')"]}, 30)
    assert out is None and err == "exit code 1: boom"


def test_json_written_with_fake_timer(sb, fake_timer, tmp_path, monkeypatch):
    monkeypatch.setenv("ANYFP4_COMMIT", "abc123")
    monkeypatch.setattr(sb, "ROOT", tmp_path)  # not a git checkout: the commit comes from ANYFP4_COMMIT
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "board.json"
    assert sb.main(["--dry-run", "--skip-e2e", "--out", str(out), "--shapes", "256x256", "--ms", "1", "4",
                    "--arms", "bf16", "anyfp4-nvfp4"]) == 0
    report = json.loads(out.read_text())
    assert {"gpu", "date", "commit", "copy_bandwidth_Bps", "rows", "e2e"} <= set(report)
    assert report["commit"] == "abc123" and report["gpu"] == "cpu" and report["e2e"] == []
    assert [(r["arm"], r["m"], r["us"]) for r in report["rows"]] == [
        ("bf16", 1, pytest.approx(10.0)), ("bf16", 4, pytest.approx(10.0)),
        ("anyfp4-nvfp4", 1, pytest.approx(10.0)), ("anyfp4-nvfp4", 4, pytest.approx(10.0))]
