"""Every kernel variant compiles ahead of time for sm_70, 75, 80, 86, 89 and 90 (no GPU needed):
fp16 activations everywhere, bf16 from sm_80 on. Catches instructions an older GPU lacks.

Runs in a subprocess per architecture: the test session may have imported the kernels under
Triton's CPU interpreter, which replaces ``@triton.jit`` functions with interpreted ones.
"""

import os
import re
import subprocess
import sys

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from anyfp4.kernels.triton.fp8_experts import fp8_experts_kernel
from anyfp4.kernels.triton.fp8_linear import fp8_dequant_kernel, fp8_gemv_kernel, fp8_raw_kernel
from anyfp4.kernels.triton.nvfp4_decode import act_block_pack_kernel, nvfp4_decode_kernel
from anyfp4.kernels.triton.nvfp4_dequant import nvfp4_dequant_kernel
from anyfp4.kernels.triton.nvfp4_epilogue import splitk_reduce_kernel
from anyfp4.kernels.triton.nvfp4_gemv import nvfp4_gemv_kernel
from anyfp4.kernels.gdn.chunked import PASS_WARPS, PREP_WARPS, chunk_pass_kernel, chunk_prep_kernel, chunk_tokens
from anyfp4.kernels.gdn.step import conv_kernel, delta_rule_kernel, gated_norm_kernel
from anyfp4.kernels.triton.dense_experts import dense_experts_kernel
from anyfp4.kernels.triton.dense_gemv import dense_gemv_kernel
from anyfp4.kernels.triton.nvfp4_experts import nvfp4_experts_kernel
from anyfp4.kernels.triton.route_topk import route_topk_kernel
from anyfp4.kernels.triton.weighted_slots import weighted_slots_kernel
from anyfp4.kernels.glue.rms_norm import add_rms_norm_kernel, rms_norm_kernel
from anyfp4.kernels.glue.rope_cache import rope_cache_kernel
from anyfp4.kernels.glue.small_attention import small_attention_kernel, small_attention_merge_kernel

ARCHS = [70, 75, 80, 86, 89, 90]


def decode_signature(act):
    return {"x_ptr": f"*{act}", "codes_ptr": "*i32", "scales_ptr": "*u8", "gscale_ptr": "*fp32",
            "bias_ptr": f"*{act}", "out_ptr": f"*{act}", "partial_ptr": "*fp32", "M": "i32", "K": "i32",
            "N_OUT": "i32", "UP_OFFSET": "i32", "X_ROWS": "i32", "K_ITERS": "i32", "SPLIT_K": "i32", "stride_xm": "i32",
            "stride_c": "i32", "stride_s": "i32", "stride_om": "i32"}


# (BLOCK_M, BLOCK_N, BLOCK_K, USE_PARTIAL, HAS_BIAS, GATED, X_PACKED): every flag value appears at least once
DECODE_VARIANTS = [(16, 64, 256, False, True, False, False), (32, 128, 128, True, False, True, True),
                   (16, 32, 256, True, False, False, True)]


def compile_for(fn, signature, constexprs, cc, num_warps=4, aligned=(), num_stages=3):
    """``aligned``: arguments the launch would specialise as multiples of 16 (pointers, strides)."""
    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": num_warps,
                                                                            "num_stages": num_stages})


def code_words_load_16_bytes(cc):
    """The tiled code words still come in 16-byte loads (the offset helper's hints), as they would at run
    time with 16-aligned pointers and strides."""
    act = "fp16"
    sig = {"x_ptr": f"*{act}", "codes_ptr": "*i32", "scales_ptr": "*u8", "gscale_ptr": "*fp32", "bias_ptr": f"*{act}",
           "out_ptr": f"*{act}", "partial_ptr": "*fp32", "K": "i32", "N_OUT": "i32", "UP_OFFSET": "i32",
           "K_ITERS": "i32", "stride_c": "i32", "stride_s": "i32"}
    k = compile_for(nvfp4_gemv_kernel, sig, {"BLOCK_N": 8, "BLOCK_K": 1024, "USE_PARTIAL": False, "HAS_BIAS": False,
                                             "GATED": False, "INTERPRET": False}, cc, num_warps=2,
                    aligned=[a for a in sig if a.endswith("_ptr") or a.startswith("stride") or a == "K"])
    assert "ld.global.v4.b32" in k.asm["ptx"]
    k = compile_for(nvfp4_dequant_kernel, {"codes_ptr": "*i32", "scales_ptr": "*u8", "gscale_ptr": "*fp32",
                                           "out_ptr": f"*{act}", "N": "i32", "K": "i32", "ROW0": "i32",
                                           "stride_c": "i32", "stride_s": "i32", "stride_on": "i32"},
                    {"BLOCK_N": 32, "BLOCK_K": 128, "INTERPRET": False}, cc,
                    aligned=["codes_ptr", "scales_ptr", "out_ptr", "stride_c", "stride_s", "stride_on"])
    assert "ld.global.v4.b32" in k.asm["ptx"]


def acts(cc):
    return ["fp16", "bf16"] if cc >= 80 else ["fp16"]


def decode_kernels_compile(cc):
    for act in acts(cc):
        for bm, bn, bk, split, bias, gated, packed in DECODE_VARIANTS:
            k = compile_for(nvfp4_decode_kernel, decode_signature(act),
                            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "USE_PARTIAL": split, "HAS_BIAS": bias,
                             "GATED": gated, "X_PACKED": packed, "SWAP_AB": False, "INTERPRET": False}, cc)
            assert len(k.asm["cubin"]) > 0
            sass_arch = k.asm["ptx"]
            assert f".target sm_{cc}" in sass_arch
            assert "cvt.rn.f16x2.e4m3x2" not in sass_arch and "e2m1" not in sass_arch  # integer decoding only
        # the fused prefill GEMM's tiles (ANYFP4_PREFILL=fused), the decoded tile as either operand
        for gated, swap in ((False, False), (True, False), (False, True), (True, True)):
            k = compile_for(nvfp4_decode_kernel, decode_signature(act),
                            {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "USE_PARTIAL": False, "HAS_BIAS": not gated,
                             "GATED": gated, "X_PACKED": False, "SWAP_AB": swap, "INTERPRET": False}, cc, num_warps=8,
                            aligned=("x_ptr", "codes_ptr", "scales_ptr", "out_ptr", "K", "stride_xm", "stride_c",
                                     "stride_s", "stride_om"))
            assert f".target sm_{cc}" in k.asm["ptx"]
            if cc == 90 and swap:  # wgmma reads the decoded tile from registers, and one multiply stays in flight
                lines = k.asm["ttgir"].splitlines()  # while the next tile is decoded
                dots = [line for line in lines if "ttng.warp_group_dot " in line]
                assert dots and all("dot_op<{opIdx = 0" in line for line in dots), dots
                assert any(re.search(r"pendings = [1-9]", line) for line in lines if "warp_group_dot_wait" in line)


def early_for(cc):
    """The glue kernels start early (programmatic dependent launch) on sm_90 only."""
    return cc >= 90


def support_kernels_compile(cc):
    early = early_for(cc)
    for act in acts(cc):
        reduce_sig = {"partial_ptr": "*fp32", "gscale_ptr": "*fp32", "bias_ptr": f"*{act}", "out_ptr": f"*{act}",
                      "M": "i32", "N_OUT": "i32", "stride_om": "i32", "SPLIT_K": "i32"}
        for gated in (False, True):
            compile_for(splitk_reduce_kernel, reduce_sig, {"BLOCK_R": 256, "HAS_BIAS": not gated,
                                                           "GATED": gated, "INTERPRET": False}, cc)
        gemv_sig = {"x_ptr": f"*{act}", "codes_ptr": "*i32", "scales_ptr": "*u8", "gscale_ptr": "*fp32",
                    "bias_ptr": f"*{act}", "out_ptr": f"*{act}", "partial_ptr": "*fp32", "K": "i32", "N_OUT": "i32",
                    "UP_OFFSET": "i32", "K_ITERS": "i32", "stride_c": "i32", "stride_s": "i32"}
        for use_partial, bias, gated in ((False, True, False), (True, False, True)):
            compile_for(nvfp4_gemv_kernel, gemv_sig, {"BLOCK_N": 8, "BLOCK_K": 1024, "USE_PARTIAL": use_partial,
                                                      "HAS_BIAS": bias, "GATED": gated, "INTERPRET": False}, cc,
                        num_warps=2)
        fp8_sig = {"x_ptr": f"*{act}", "codes_ptr": "*i32", "scales_ptr": "*fp32", "bias_ptr": f"*{act}",
                   "out_ptr": f"*{act}", "K": "i32", "N_OUT": "i32", "UP_OFFSET": "i32", "K_TILES": "i32",
                   "stride_c": "i32"}
        for bias, gated in ((True, False), (False, True)):
            compile_for(fp8_gemv_kernel, fp8_sig, {"BLOCK_N": 8, "BLOCK_K": 512, "HAS_BIAS": bias, "GATED": gated,
                                                   "INTERPRET": False}, cc, num_warps=2)
        compile_for(fp8_dequant_kernel, {"codes_ptr": "*i32", "scales_ptr": "*fp32", "out_ptr": f"*{act}", "N": "i32",
                                         "K": "i32", "ROW0": "i32", "stride_c": "i32", "stride_on": "i32"},
                    {"BLOCK_N": 32, "BLOCK_K": 128, "INTERPRET": False}, cc)
        if cc >= 89:  # the opt-in W8A8 prefill's weight write-back (FP8 matmuls need sm_89+)
            compile_for(fp8_raw_kernel, {"codes_ptr": "*i32", "out_ptr": "*i32", "ROW0": "i32", "stride_c": "i32",
                                         "stride_o": "i32"}, {"BLOCK_N": 32, "BLOCK_W": 64}, cc)
        compile_for(act_block_pack_kernel, {"x_ptr": f"*{act}", "xp_ptr": f"*{act}", "M": "i32", "K": "i32",
                                            "stride_xm": "i32", "X_ROWS": "i32"}, {"BLOCK_G": 16}, cc)
        compile_for(nvfp4_dequant_kernel, {"codes_ptr": "*i32", "scales_ptr": "*u8", "gscale_ptr": "*fp32",
                                           "out_ptr": f"*{act}", "N": "i32", "K": "i32", "ROW0": "i32",
                                           "stride_c": "i32", "stride_s": "i32", "stride_on": "i32"},
                    {"BLOCK_N": 32, "BLOCK_K": 128, "INTERPRET": False}, cc)
        k = compile_for(rms_norm_kernel, {"x_ptr": f"*{act}", "w_ptr": f"*{act}", "y_ptr": f"*{act}", "n_cols": "i32",
                                          "stride_x": "i32", "stride_y": "i32", "eps": "fp32"},
                        {"BLOCK": 4096, "INTERPRET": False, "EARLY": early}, cc, num_warps=16)
        ptx = k.asm["ptx"]
        assert (ptx.count("griddepcontrol.launch_dependents") == 1 and ptx.count("griddepcontrol.wait") == 1
                and ptx.index("griddepcontrol.wait") < ptx.index("ld.global")) == early
        compile_for(add_rms_norm_kernel, {"x_ptr": f"*{act}", "d_ptr": f"*{act}", "w_ptr": f"*{act}", "h_ptr": f"*{act}",
                                          "y_ptr": f"*{act}", "n_cols": "i32", "stride_x": "i32", "stride_d": "i32",
                                          "stride_h": "i32", "stride_y": "i32", "eps": "fp32"},
                    {"BLOCK": 4096, "INTERPRET": False, "EARLY": early}, cc, num_warps=16)
        attn_sig = {"q_ptr": f"*{act}", "k_ptr": f"*{act}", "v_ptr": f"*{act}", "mask_ptr": "*i1", "pos_ptr": "*i64",
                    "start_ptr": "*i64", "part_ptr": "*fp32", "stat_ptr": "*fp32", **{n: "i32" for n in ("T", "G", "KVH", "HD", "SEG")},
                    "scale": "fp32", **{n: "i32" for n in ("sq_b", "sq_h", "sq_t", "sk_b", "sk_h", "sk_s", "sv_b",
                                                          "sv_h", "sv_s", "sm_b", "sm_t")}}
        merge_sig = {"part_ptr": "*fp32", "stat_ptr": "*fp32", "pos_ptr": "*i64", "start_ptr": "*i64",
                     "out_ptr": f"*{act}", "gate_ptr": f"*{act}",
                     **{n: "i32" for n in ("T", "G", "KVH", "HD", "SEG", "NSEG", "so_b", "so_t", "so_h", "sg_b",
                                           "sg_t", "sg_h")}}
        for block_d, gate in ((64, False), (128, False), (256, True)):  # Qwen3.5's gated 256-wide heads
            flags = {"EARLY": early}
            compile_for(small_attention_kernel, attn_sig, {"BLOCK_D": block_d, "INTERPRET": False, **flags}, cc)
            compile_for(small_attention_merge_kernel, merge_sig, {"BLOCK_D": block_d, "BLOCK_S": 64, "GATE": gate,
                                                                  "INTERPRET": False, **flags}, cc)
        rope_sig = {**{n: f"*{act}" for n in ("q_ptr", "k_ptr", "v_ptr", "qo_ptr", "kc_ptr", "vc_ptr")},
                    "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64",
                    **{n: "i32" for n in ("T", "H", "HALF", "HD", "sq_b", "sq_t", "sq_h", "sk_b", "sk_t", "sk_h", "sv_b",
                                          "sv_t", "sv_h", "sc_b", "sc_t", "sqo_b", "sqo_t", "sqo_h", "skc_b",
                                          "skc_h", "skc_s", "svc_b", "svc_h", "svc_s")}}
        # full rotary with and without Qwen3's head norms (weights of the activations' dtype), Qwen3.5's quarter of
        # a 256-wide head with its zero-centred (float32) ones, and q / k weights of two dtypes
        for block, block_hd, qw, kw in ((64, 128, None, None), (64, 128, act, act), (32, 256, "fp32", "fp32"),
                                        (32, 64, "fp32", act)):
            sig = {**rope_sig, "qw_ptr": f"*{qw or act}", "kw_ptr": f"*{kw or act}", "eps": "fp32"}
            compile_for(rope_cache_kernel, sig, {"BLOCK": block, "BLOCK_HD": block_hd, "NORM": qw is not None,
                                                 "INTERPRET": False, "EARLY": early}, cc, num_warps=1)
        gdn_kernels_compile(act, cc)
        experts_kernels_compile(act, cc)
        for bias in (False, True):
            compile_for(dense_gemv_kernel, {"x_ptr": f"*{act}", "w_ptr": f"*{act}", "bias_ptr": f"*{act}",
                                            "out_ptr": f"*{act}", **{n: "i32" for n in ("N", "K", "stride_xm",
                                                                                       "stride_wn", "stride_om")}},
                        {"BLOCK_N": 2, "BLOCK_K": 1024, "HAS_BIAS": bias, "INTERPRET": False}, cc)


def experts_kernels_compile(act, cc):
    """The grouped expert GEMVs of a mixture of experts (NVFP4, FP8 and float), gated and plain."""
    sizes = ("K", "N_OUT", "UP_OFFSET", "K_TILES", "PAIRS_PER_ROW", "stride_x", "stride_o", "stride_ce", "stride_se",
             "stride_c", "stride_s")
    for gated in (False, True):
        compile_for(nvfp4_experts_kernel, {"x_ptr": f"*{act}", "ids_ptr": "*i32", "codes_ptr": "*i32",
                                           "scales_ptr": "*u8", "gscale_ptr": "*fp32", "out_ptr": f"*{act}",
                                           **{n: "i32" for n in sizes}},
                    {"BLOCK_N": 8, "BLOCK_K": 256, "GATED": gated, "INTERPRET": False}, cc, num_warps=2)
        compile_for(fp8_experts_kernel, {"x_ptr": f"*{act}", "ids_ptr": "*i32", "codes_ptr": "*i32",
                                         "scales_ptr": "*fp32", "out_ptr": f"*{act}", **{n: "i32" for n in (
                                             "K", "N_OUT", "UP_OFFSET", "K_TILES", "PAIRS_PER_ROW", "stride_x",
                                             "stride_o", "stride_ce", "stride_se", "stride_c")}},
                    {"BLOCK_N": 8, "BLOCK_K": 512, "GATED": gated, "INTERPRET": False}, cc, num_warps=2)
        compile_for(dense_experts_kernel, {"x_ptr": f"*{act}", "ids_ptr": "*i32", "w_ptr": f"*{act}",
                                           "out_ptr": f"*{act}", **{n: "i32" for n in (
                                               "N_OUT", "K", "PAIRS_PER_ROW", "stride_x", "stride_we", "stride_wn",
                                               "stride_o")}},
                    {"BLOCK_N": 4, "BLOCK_K": 512, "GATED": gated, "INTERPRET": False}, cc)
    strides = ("H", "stride_pr", "stride_pk", "stride_wr", "stride_wk", "stride_or")
    compile_for(weighted_slots_kernel, {"p_ptr": f"*{act}", "w_ptr": "*fp32", "out_ptr": "*fp32",
                                        **{n: "i32" for n in strides}}, {"K": 8, "BLOCK": 512}, cc)
    for experts, k, normalize in ((128, 8, True), (8, 2, False)):  # Qwen3 MoE, Mixtral
        compile_for(route_topk_kernel, {"logits_ptr": f"*{act}", "ids_ptr": "*i32", "weights_ptr": "*fp32",
                                        **{n: "i32" for n in ("E", "stride_l", "stride_i", "stride_w")}},
                    {"K": k, "K_POW2": k, "BLOCK_E": experts, "NORMALIZE": normalize, "EARLY": early_for(cc)}, cc,
                    num_warps=1)


def gdn_kernels_compile(act, cc):
    """The Gated DeltaNet kernels at Qwen3.5-27B's head sizes, with and without snapshots and left padding (and a
    norm weight in float32)."""
    early = early_for(cc)
    for snap, block_t in ((False, 1), (True, 16)):  # a decode step's one token; a verify pass or prompt
        for proj in (False, True):  # with the b / a projection's programs
            compile_for(conv_kernel, {**{n: f"*{act}" for n in ("x_ptr", "w_ptr", "state_ptr", "y_ptr", "snap_ptr",
                                                                "h_ptr", "pw_ptr", "pb_ptr", "po_ptr")},
                                      **{n: "i32" for n in (
                                          "T", "channels", "stride_xb", "stride_xt", "stride_sb", "stride_sc",
                                          "stride_yb", "stride_yt", "stride_pb", "stride_pt", "stride_pc", "PN", "PK",
                                          "stride_hb", "stride_ht", "stride_pw", "stride_qb", "stride_qt",
                                          "conv_blocks")}},
                        {"WIDTH": 4, "SNAP": snap, "BLOCK_T": block_t, "BLOCK_C": 256, "PROJ": proj,
                         "PROJ_BIAS": proj and snap, "INTERPRET": False, "EARLY": early}, cc)
        sig = {**{n: f"*{act}" for n in ("mixed_ptr", "a_ptr", "b_ptr")}, "neg_a_ptr": "*fp32", "dt_bias_ptr": "*fp32",
               "state_ptr": "*fp32", "out_ptr": f"*{act}", "valid_ptr": "*fp32", "snap_ptr": "*fp32",
               **{n: "i32" for n in ("T", "v_heads", "stride_mb", "stride_mt", "stride_ab", "stride_at", "stride_bb",
                                     "stride_bt", "stride_ob", "stride_ot", "stride_vb", "stride_pb", "stride_pt")},
               "q_scale": "fp32"}
        compile_for(delta_rule_kernel, sig, {"K_HEADS": 16, "DK": 128, "DV": 128, "BK": 128, "BV": 32,
                                             "HAS_VALID": snap, "SNAP": snap, "INTERPRET": False, "EARLY": early}, cc)
    chunk = chunk_tokens(SHARED_MEMORY_LIMIT[cc])  # the chunked prefill kernels at the chunk this GPU gets
    for valid in (False, True):
        sig = {**{n: f"*{act}" for n in ("mixed_ptr", "a_ptr", "b_ptr")}, "neg_a_ptr": "*fp32", "dt_bias_ptr": "*fp32",
               **{n: "*fp32" for n in ("valid_ptr", "w_ptr", "u_ptr", "p_ptr", "gamma_ptr")},
               **{n: "i32" for n in ("T", "v_heads", "stride_mb", "stride_mt", "stride_ab", "stride_at", "stride_bb",
                                     "stride_bt", "stride_vb")}, "q_scale": "fp32"}
        fits_shared_memory(compile_for(chunk_prep_kernel, sig, {
            "K_HEADS": 16, "DK": 128, "DV": 128, "BK": 128, "BDV": 128, "C": chunk, "HAS_VALID": valid,
            "EARLY": early}, cc, num_warps=PREP_WARPS, num_stages=1), cc)
    sig = {"mixed_ptr": f"*{act}", **{n: "*fp32" for n in ("w_ptr", "u_ptr", "p_ptr", "gamma_ptr", "state_ptr")},
           "out_ptr": f"*{act}", **{n: "i32" for n in ("T", "CHUNKS", "v_heads", "stride_mb", "stride_mt", "stride_ob",
                                                       "stride_ot")}, "q_scale": "fp32"}
    fits_shared_memory(compile_for(chunk_pass_kernel, sig, {
        "K_HEADS": 16, "DK": 128, "DV": 128, "BK": 128, "BDV": 128, "BV": 32, "C": chunk, "INTERPRET": False,
        "EARLY": early}, cc, num_warps=PASS_WARPS, num_stages=1), cc)
    for norm_w in (act, "fp32"):
        compile_for(gated_norm_kernel, {"x_ptr": f"*{act}", "z_ptr": f"*{act}", "w_ptr": f"*{norm_w}",
                                        "out_ptr": f"*{act}", **{n: "i32" for n in ("heads", "stride_xr", "stride_zr",
                                                                                   "stride_or")}, "eps": "fp32"},
                    {"D": 128, "BD": 128, "INTERPRET": False, "EARLY": early}, cc, num_warps=1)


# the most shared memory a block may ask for (opt-in maximum), by compute capability
SHARED_MEMORY_LIMIT = {70: 96 << 10, 75: 64 << 10, 80: 163 << 10, 86: 99 << 10, 89: 99 << 10, 90: 227 << 10}


def fits_shared_memory(kernel, cc):
    """A chunked prefill kernel, compiled at the chunk the launcher picks on sm_``cc``, fits its shared memory."""
    if kernel.metadata.shared > SHARED_MEMORY_LIMIT[cc]:
        raise SystemExit(f"{kernel.name} asks for {kernel.metadata.shared} bytes of shared memory on sm_{cc}, "
                         f"more than {SHARED_MEMORY_LIMIT[cc]}")


@pytest.mark.parametrize("cc", ARCHS)
def test_all_kernels_compile(cc):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, __file__, str(cc)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == f"compiled for sm_{cc}"


if __name__ == "__main__":
    arch = int(sys.argv[1])
    decode_kernels_compile(arch)
    support_kernels_compile(arch)
    code_words_load_16_bytes(arch)
    print(f"compiled for sm_{arch}")
