"""The RMSNorm kernel against its pure-torch definition (Triton's interpreter on the CPU, the kernel on
a GPU), fresh random inputs, NaN-poisoned outputs; and a row's bits do not depend on the row count."""

import pytest
import torch

import anyfp4.ops  # noqa: F401  (registers torch.ops.anyfp4)

from anyfp4.kernels.glue.reference import rms_norm_reference
from anyfp4.kernels.glue.rms_norm import add_rms_norm_triton, rms_norm_triton

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 576), (2, 5, 256), (4, 100)])
def test_rms_norm_matches_reference(device, dtype, shape):
    g = torch.Generator().manual_seed(hash((shape, str(dtype))) % 2**31)
    x = (torch.randn(shape, generator=g) * 3).to(device=device, dtype=dtype)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(device=device, dtype=dtype)
    out = torch.full(shape, float("nan"), dtype=dtype, device=device)
    y = rms_norm_triton(x, w, 1e-5, out=out)
    assert y.data_ptr() == out.data_ptr() and not y.isnan().any()
    ref = rms_norm_reference(x, w, 1e-5)
    torch.testing.assert_close(y.float(), ref.float(), rtol=TOL[dtype], atol=TOL[dtype])


def test_rows_do_not_depend_on_the_row_count(device):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8, 4096, generator=g).to(device=device, dtype=torch.bfloat16)
    w = torch.rand(4096, generator=g).to(device=device, dtype=torch.bfloat16)
    full = rms_norm_triton(x, w, 1e-6)
    for i in (0, 5):
        assert torch.equal(rms_norm_triton(x[i:i + 1], w, 1e-6), full[i:i + 1])


def test_the_op_checks_its_weight():
    with pytest.raises(ValueError, match="rms_norm: weight has shape"):
        torch.ops.anyfp4.rms_norm(torch.zeros(2, 8), torch.ones(7), 1e-5)


def test_the_op_passes_opcheck_on_strided_input(device):
    x = torch.randn(2, 3, 64, device=device).transpose(0, 1)
    torch.library.opcheck(torch.ops.anyfp4.rms_norm.default, (x, torch.rand(64, device=device) + 0.5, 1e-5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(3, 576), (2, 5, 256), (4, 100)])
def test_add_rms_norm_matches_reference(device, dtype, shape):
    g = torch.Generator().manual_seed(hash((shape, str(dtype), "add")) % 2**31)
    x, d = ((torch.randn(shape, generator=g) * 3).to(device=device, dtype=dtype) for _ in range(2))
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(device=device, dtype=dtype)
    out = tuple(torch.full(shape, float("nan"), dtype=dtype, device=device) for _ in range(2))
    h, y = add_rms_norm_triton(x, d, w, 1e-5, out=out)
    assert h.data_ptr() == out[0].data_ptr() and y.data_ptr() == out[1].data_ptr()
    assert torch.equal(h, x + d)  # the residual stream is rounded exactly as torch's add rounds it
    torch.testing.assert_close(y.float(), rms_norm_reference(x + d, w, 1e-5).float(), rtol=TOL[dtype],
                               atol=TOL[dtype])


def test_add_rms_norm_op_checks_and_opcheck(device):
    x = torch.randn(2, 3, 64, device=device).transpose(0, 1)
    torch.library.opcheck(torch.ops.anyfp4.add_rms_norm.default, (x, torch.randn_like(x), torch.rand(64, device=device),
                                                                  1e-5))
    with pytest.raises(ValueError, match="delta"):
        torch.ops.anyfp4.add_rms_norm(torch.zeros(2, 8), torch.zeros(2, 7), torch.ones(8), 1e-5)
