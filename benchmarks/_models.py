"""Small models the benchmarks share (their own module: ``_common`` does not import torch)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class PreNormBlock(nn.Module):
    """A pre-norm transformer block: self-attention through SDPA, then a GELU MLP, each with a
    residual (the training benchmark's block, the DDP benchmark's layers)."""

    def __init__(self, d: int = 256, heads: int = 4, causal: bool = False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.causal = heads, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TokensIn(nn.Module):
    """``model(input_ids=...)`` (with ``decoder_input_ids`` for encoder-decoders) called
    positionally; returns the logits or the last hidden state, one tensor to compare (the CPU
    benchmark's and the correctness sweep's transformers models)."""

    def __init__(self, model: nn.Module, decoder: bool = False):
        super().__init__()
        self.model = model
        self.decoder = decoder

    def forward(self, input_ids, decoder_input_ids=None):
        if self.decoder:
            out = self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids)
        else:
            out = self.model(input_ids=input_ids)
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def hf_model(config_cls: str, model_cls: str, **config):
    """``transformers.<model_cls>(<config_cls>(**config))`` with random weights: a model built
    from its config, as the benchmarks build every transformers model (no download)."""
    import transformers

    return getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config))


def no_dropout(model: nn.Module) -> nn.Module:
    """Every ``nn.Dropout`` at p=0, so a training step is deterministic and a compiled step's
    loss can be compared with eager's (configs set their functional dropouts to 0 too)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
    return model


class WhisperEncoderIn(nn.Module):
    """Whisper's encoder on log-mel features (2 convolutions, then attention); returns the last
    hidden state."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_features):
        return self.encoder(input_features=input_features).last_hidden_state
