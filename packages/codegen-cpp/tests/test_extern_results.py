"""Generated kernels that read an extern's result (issue 9): they index it with its buffer's
layout, which must be the layout the extern really returned."""

import torch
import torch.nn.functional as F
from kiln_codegen_cpp import compile_fx

B, T, H, D = 2, 8, 4, 16


def attention(x, wq, wk, wv):
    """Llama's pattern: q and k are pointwise results (rotary embedding) of permuted views,
    which eager keeps laid out [b, t, h, d]; SDPA's result layout follows its query's."""
    q = (x @ wq).view(B, T, H, D).transpose(1, 2) * 0.5 + 1.0
    k = (x @ wk).view(B, T, H, D).transpose(1, 2).sin()
    v = (x @ wv).view(B, T, H, D).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(B, T, H * D) + 1.0


def test_kernel_after_sdpa_reads_its_real_layout():
    torch.manual_seed(0)
    args = [torch.randn(B, T, H * D)] + [torch.randn(H * D, H * D) for _ in range(3)]
    compiled = compile_fx(torch.fx.symbolic_trace(attention), args)
    torch.testing.assert_close(compiled(*args)[0], attention(*args), rtol=1e-4, atol=1e-4)


class ConvBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return (self.conv(x.sin()) * 2.0).relu()


def test_kernel_after_channels_last_conv():
    """A channels-last convolution's result (the layout make_extern derives for the
    channels-last input and weight) read by a pointwise kernel and returned NCHW."""
    torch.manual_seed(0)
    block = ConvBlock().eval()
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        compiled = compile_fx(torch.fx.symbolic_trace(block), [x])
        torch.testing.assert_close(compiled(x)[0], block(x), rtol=1e-4, atol=1e-4)
