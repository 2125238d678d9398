"""The runner's Gated DeltaNet mixer (runtime/gated_deltanet.py) against transformers' Qwen3.5 layer with the same
weights in float32: a chunked prefill of the prompt, then decode steps from its states, give the layer's outputs
over the whole sequence; batch rows alone equal them in the batch; wrong shapes are refused by name."""

import pytest
import torch

from anyfp4.runtime.gated_deltanet import GatedDeltaNet, GDNShape

hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
from transformers import Qwen3_5TextConfig  # noqa: E402


def layers(seed: int):
    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(hidden_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                            linear_value_head_dim=12, linear_conv_kernel_dim=4, num_hidden_layers=1,
                            layer_types=["linear_attention"], rms_norm_eps=1e-6)
    theirs = hf.Qwen3_5GatedDeltaNet(cfg, 0).float().eval()
    with torch.no_grad():
        theirs.norm.weight.copy_(1 + 0.2 * torch.randn(12))
        theirs.dt_bias.copy_(torch.randn(4))
        for lin in (theirs.in_proj_qkv, theirs.in_proj_z, theirs.in_proj_b, theirs.in_proj_a, theirs.out_proj):
            lin.weight.normal_(0, 0.2)
    shape = GDNShape(k_heads=2, v_heads=4, k_dim=8, v_dim=12, conv_kernel=4)
    pairs = torch.nn.ModuleList([theirs.in_proj_qkv, theirs.in_proj_z]), torch.nn.ModuleList([theirs.in_proj_b,
                                                                                              theirs.in_proj_a])
    mine = GatedDeltaNet(shape, *pairs, theirs.out_proj, theirs.conv1d.weight.detach()[:, 0].clone(),
                         theirs.A_log.detach().clone(), theirs.dt_bias.detach().clone(),
                         theirs.norm.weight.detach().clone(), 1e-6)
    return theirs, mine


class RowByRow(torch.nn.Module):
    """A linear whose rows do not depend on how many there are (CPU matmul blocking does): one product a row."""

    def __init__(self, lin):
        super().__init__()
        self.weight = lin.weight

    def forward(self, x):
        return (x[..., None, :] * self.weight).sum(-1)


def row_by_row(mine):
    """``mine`` with every projection replaced by a RowByRow of it."""
    for pair in ("in_proj_qkvz", "in_proj_ba"):
        setattr(mine, pair, torch.nn.ModuleList([RowByRow(m) for m in getattr(mine, pair)]))
    mine.out_proj = RowByRow(mine.out_proj)
    return mine


def close(a, b, tol=1e-4):
    return ((a.double() - b.double()).norm() / b.double().norm()).item() < tol


@torch.no_grad()
def test_prefill_then_decode_is_the_layer_over_the_whole_sequence():
    theirs, mine = layers(1)
    x = torch.randn(2, 44, 48)
    want = theirs(x)
    mine.setup_state(2)
    y = [mine(x[:, :40])]  # > DECODE_ROWS: the chunked form
    y += [mine(x[:, i:i + 1]) for i in range(40, 44)]  # decode steps from the prefill's states
    assert close(torch.cat(y, 1), want)
    mine.setup_state(2)
    assert close(torch.cat([mine(x[:, :5]), mine(x[:, 5:44])], 1), want)  # a short prompt: token by token


@torch.no_grad()
def test_rows_alone_equal_rows_in_a_batch():
    _, mine = layers(2)
    row_by_row(mine)
    x = torch.randn(3, 6, 48)
    mine.setup_state(3)
    together = torch.cat([mine(x[:, i:i + 1]) for i in range(6)], 1)
    for r in range(3):
        mine.setup_state(1)
        alone = torch.cat([mine(x[r:r + 1, i:i + 1]) for i in range(6)], 1)
        assert torch.equal(alone, together[r:r + 1]), r


def test_wrong_shapes_are_named():
    theirs, mine = layers(3)
    args = dict(shape=mine.shape, in_proj_qkvz=mine.in_proj_qkvz, in_proj_ba=mine.in_proj_ba, out_proj=theirs.out_proj,
                conv_weight=torch.zeros(80, 4), a_log=torch.zeros(4), dt_bias=torch.zeros(4),
                norm_weight=torch.ones(12), eps=1e-6)
    GatedDeltaNet(**args)
    with pytest.raises(ValueError, match=r"conv weight has shape \(80, 3\), the head counts give \(80, 4\)"):
        GatedDeltaNet(**{**args, "conv_weight": torch.zeros(80, 3)})
    with pytest.raises(ValueError, match="A_log"):
        GatedDeltaNet(**{**args, "a_log": torch.zeros(5)})
    with pytest.raises(ValueError, match="value heads do not share"):
        GatedDeltaNet(**{**args, "shape": GDNShape(3, 4, 8, 12, 4)})
    with pytest.raises(RuntimeError, match="setup_state"):
        mine(torch.zeros(1, 1, 48))


def test_hybrid_draft_models_are_refused_and_tensor_parallel_splits_checked():
    from anyfp4.parallel.sharding import check_divisible
    from anyfp4.runtime.config import ModelArgs
    from anyfp4.runtime.generate import SamplingParams
    from anyfp4.runtime.speculative import generate_speculative

    args = ModelArgs.from_hf({"model_type": "qwen3_5_text", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                              "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2,
                              "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                              "linear_conv_kernel_dim": 4})
    assert args.rope_dim == 4 and args.gdn.conv_channels == 128 and args.attn_output_gate  # a quarter of 16

    class Stub:
        pass

    stub = Stub()
    stub.args = args
    with pytest.raises(NotImplementedError, match="a draft model with Gated DeltaNet layers"):
        generate_speculative(stub, [1, 2], SamplingParams(max_new_tokens=2), 2, draft_model=stub)
    check_divisible(args, 2)  # two ranks: one key head and two value heads each (tests/parallel/test_model.py)
    with pytest.raises(ValueError, match="2 Gated DeltaNet key heads"):
        check_divisible(args, 4)


def test_snapshots_return_to_any_prefix_of_a_step():
    """Keeping the states after the first tokens of a step, the next token's output is that of a run over just
    those tokens (bit for bit: linears whose rows do not depend on their number)."""
    _, mine = layers(4)
    row_by_row(mine)
    x = torch.randn(1, 10, 48)
    with torch.no_grad():
        for keep in (1, 3, 5):
            mine.setup_state(1)
            mine(x[:, :4])
            mine.setup_snapshots(5)
            mine(x[:, 4:9])
            mine.keep_states(keep, 5)
            after = mine(x[:, 4 + keep:4 + keep + 1])
            mine.setup_state(1)
            want = mine(x[:, :4 + keep + 1])[:, -1:]
            assert torch.equal(after, want), keep
        with pytest.raises(ValueError, match="cannot keep the states after 3 of 6 tokens: .* up to 5"):
            mine.keep_states(3, 6)
        mine.setup_snapshots(0)
        with pytest.raises(ValueError, match="snapshots are kept for steps of up to 0"):
            mine.keep_states(1, 2)


def test_hybrid_config_defaults_and_refusals():
    from anyfp4.checkpoint.errors import CheckpointError
    from anyfp4.runtime.config import ModelArgs, UnsupportedModelError

    base = {"model_type": "qwen3_5_text", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    args = ModelArgs.from_hf(base)  # transformers' defaults: a full attention layer every 4th, RoPE on a quarter
    assert args.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",)
    assert args.rope_dim == 4 and (args.gdn.k_heads, args.gdn.v_heads, args.gdn.k_dim) == (16, 32, 128)
    with pytest.raises(CheckpointError, match="'layer_types' must list 8 entries"):
        ModelArgs.from_hf({**base, "layer_types": ["linear_attention"] * 7})
    with pytest.raises(CheckpointError, match="'linear_num_value_heads' 6 is not a multiple"):
        ModelArgs.from_hf({**base, "linear_num_key_heads": 4, "linear_num_value_heads": 6})
    for moe in ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"):
        with pytest.raises(UnsupportedModelError, match=f"'{moe}': hybrid models with mixture-of-experts MLPs are "
                                                        "not supported yet"):
            ModelArgs.from_hf({**base, "model_type": moe})
    vision_language = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                       "text_config": {**base, "model_type": "qwen3_5_text"}}
    text = ModelArgs.from_hf(vision_language)
    assert (text.weights_prefix, text.vision_prefix) == ("model.language_model.", "model.visual.")
    assert text.layer_types == ModelArgs.from_hf(base).layer_types and "text model" in text.architecture
    for bad, why in (({"text_config": None}, "needs a 'text_config' object"),
                     ({"architectures": ["Qwen3_5ForCausalLM"]}, "would run the text model of"),
                     ({"tie_word_embeddings": True, "text_config": {**base, "tie_word_embeddings": False}},
                      "'tie_word_embeddings' is True at the top and False in 'text_config'"),
                     ({"text_config": {**base, "model_type": "qwen3_5_moe_text"}}, "text model is 'qwen3_5_text'")):
        with pytest.raises(CheckpointError, match=why):
            ModelArgs.from_hf({**vision_language, **bad})
