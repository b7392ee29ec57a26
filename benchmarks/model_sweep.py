"""Correctness sweep: many small real models (timm and transformers, random weights) through
``kiln.compile`` against eager, inference and training, to find wrong answers and crashes on
models nobody tuned kiln for.

    python benchmarks/model_sweep.py                      # every model, inference + training
    python benchmarks/model_sweep.py --only resnet18,gpt2 --no-train
    python benchmarks/model_sweep.py --timeout 300        # seconds per model and mode
    python3 -m nox -s sweep -- --no-train                 # the same through nox
    python benchmarks/model_sweep.py --device cuda --no-patterns --budget 480 --timeout 120
    bash scripts/device_tests.sh sweep --no-patterns --budget 480 --timeout 120  # the lent GPU

Each model is built with random weights (``timm.create_model(name, pretrained=False)``, or a
transformers config class with 1-2 layers and hidden sizes of 32-64), CPU float32, batch 2,
64x64 images (or the model's minimum) and 16 tokens. With ``--device cuda`` the model and its
inputs (the same values: built on the CPU, then moved) go to the GPU; eager CUDA is the
reference, kiln compiles with its CUDA codegen (Triton), and TF32 is off for matmuls and
cuDNN convolutions (``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32`` = False) so that float32 is float32 on both sides; the
float64 second look runs on the GPU too.

- inference: ``model.eval()``, ``torch.no_grad()``; eager output = the reference; the output
  of ``kiln.compile(model)`` (backend "kiln": C++ codegen on CPU, Triton on CUDA) must match it
  (``assert_close``, rtol = atol = 1e-3: float32 models whose kernels sum in another order);
- training (models marked ``train``): ``model.train()`` with dropout at p=0 (timm models have
  no dropout by default; transformers configs set every dropout probability to 0), one
  forward + backward of ``sum(out.square().mean())`` over the float outputs; the loss, every
  parameter's grad and every floating buffer (BatchNorm's running stats) must match eager's
  (rtol = atol = 1e-3); where eager leaves a grad None, all zeros pass. A value outside that
  tolerance is checked against a float64 run of the same model: it passes as float32 noise
  when kiln's max error against float64 is at most 10x eager's float32 error (or under 1e-3),
  else it is WRONG (the same second look applies to inference outputs);
- patterns (models marked ``patterns``): what users do around a compiled model: a second
  call with another batch size, ``train()``/``eval()`` toggling between calls, a parameter
  changed in place under ``no_grad`` between calls (``p.mul_(0.5)``): each later output must
  match eager's for the model as it is then.

Per model and mode: frontend graphs, graph breaks, frames that failed to compile (the
frontend suppressed the error and ran them eagerly: counted, and reported as an error),
kiln's eager fallbacks (with reasons) and aten fallbacks (``kiln.stats()``), the time, and the
result: ``ok`` / ``WRONG`` (max abs diff) / ``error`` (exception type and first line) /
``timeout``. A model that timm or transformers cannot build is ``skipped (build)``, not a kiln
error. Writes benchmarks/results/model-sweep.json and .md (``--device cuda``:
model-sweep-cuda.json and .md, the GPU's name in the header; ``--out STEM`` for another name),
and a copy into ``$OUT`` when that is set (the lent GPU machine). The files are rewritten
after every check, so a run that is killed still leaves a report (the check it was in:
``not finished``; the ones after it: ``not run``).

``--budget SECONDS`` bounds the whole run: a check starts only while less time than that has
gone by, and its time limit is cut to what is left of the budget plus 30 s; the checks never
started are ``not run (budget)``. With a budget the checks run mode by mode (every inference
check, then training, then patterns: ``--order mode``) so that a cut loses the later modes,
not the later models; without one, model by model (``--order model``). On CUDA the cache is
emptied after each check, an out-of-memory error is that check's ``error`` row, and a check
that leaves the CUDA context broken (an illegal memory access is sticky) has the process
start again on the checks left (same budget clock, same cache).

Kernels compile into ``--cache-dir`` (default: a fresh temp folder), so ``--cache-dir`` with a
folder kept between runs makes reruns cheap.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from _common import RESULTS_DIR, ROOT, first_line, markdown_table, tensors_of  # noqa: E402
from _models import TokensIn  # noqa: E402

RTOL = ATOL = 1e-3
BATCH, TOKENS, VOCAB = 2, 16, 128
#: where the checks run (``--device``): models and inputs are built on the CPU, then moved
DEVICE = torch.device("cpu")
#: seconds a check may run past ``--budget`` (its time limit is cut to what is left plus this)
BUDGET_GRACE = 30.0
MODES = ("infer", "train", "patterns")

# ------------------------------------------------------------------------------- the models


@dataclasses.dataclass
class SweepModel:
    """A model factory (``build() -> (model, make_inputs)``; ``make_inputs(batch)`` gives a
    fresh input tuple, ``make_inputs(batch, other_size=True)`` one with other image sizes or
    sequence lengths) and which modes it runs."""

    name: str
    build: Callable[[], tuple[nn.Module, Callable[[int], tuple]]]
    source: str  # "timm" or "transformers"
    train: bool = False
    patterns: bool = False


def _torchvision_importable() -> None:
    """timm and transformers import torchvision: the test shim (docs/testing.md)."""
    sys.path.insert(0, str(ROOT / "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()


def timm_model(name: str, size: int = 64, **kwargs) -> Callable:
    def build():
        _torchvision_importable()
        import timm

        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        return model, lambda b, other_size=False: (torch.randn(b, 3, size + 32 * other_size,
                                                               size + 32 * other_size),)

    return build


def hf_model(config_cls: str, model_cls: str, decoder: bool = False, **config) -> Callable:
    """A transformers model from ``config_cls(**config)``, fed 2x16 token ids (encoder-decoders:
    2x8 decoder ids too)."""

    def build():
        _torchvision_importable()
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        model = TokensIn(getattr(transformers, model_cls)(cfg), decoder)

        def inputs(b, other_size=False):
            t = TOKENS - 4 * other_size
            ids = torch.randint(0, VOCAB, (b, t))
            return (ids, torch.randint(0, VOCAB, (b, t // 2))) if decoder else (ids,)

        return model, inputs

    return build


class PixelsIn(nn.Module):
    """A transformers vision model called on ``pixel_values``; its last hidden state (or the
    first tensor of its output), one tensor to compare."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return out.last_hidden_state if getattr(out, "last_hidden_state", None) is not None \
            else tensors_of(out)[0]


def hf_vision(config_cls: str, model_cls: str, size: int = 64, **config) -> Callable:
    """A transformers vision model from ``config_cls(**config)``, fed 2x3x64x64 images."""

    def build():
        _torchvision_importable()
        import transformers

        model = PixelsIn(getattr(transformers, model_cls)(getattr(transformers, config_cls)(**config)))
        return model, lambda b, other_size=False: (torch.randn(b, 3, size + 32 * other_size,
                                                               size + 32 * other_size),)

    return build


_BERTLIKE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
_DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=64, use_cache=False)

#: timm models run in training mode: no dropout, no stochastic depth (swin's default is 0.1)
_NO_DROP = dict(drop_rate=0.0, drop_path_rate=0.0)

_BART = dict(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
             encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
             decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
             activation_dropout=0.0, use_cache=False)
_VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

MODELS: list[SweepModel] = [
    # ---- timm
    SweepModel("resnet18", timm_model("resnet18", **_NO_DROP), "timm", train=True, patterns=True),
    SweepModel("regnetx_002", timm_model("regnetx_002"), "timm"),
    SweepModel("efficientnet_b0", timm_model("efficientnet_b0", **_NO_DROP), "timm", train=True, patterns=True),
    SweepModel("mobilenetv2_050", timm_model("mobilenetv2_050"), "timm"),
    SweepModel("mobilenetv3_small_050", timm_model("mobilenetv3_small_050"), "timm", train=True, patterns=True),
    SweepModel("ghostnet_050", timm_model("ghostnet_050"), "timm"),
    SweepModel("convnext_atto", timm_model("convnext_atto", **_NO_DROP), "timm", train=True, patterns=True),
    SweepModel("vit_tiny", timm_model("vit_tiny_patch16_224", img_size=64, depth=2, **_NO_DROP), "timm",
               train=True, patterns=True),
    SweepModel("deit_tiny_distilled", timm_model("deit_tiny_distilled_patch16_224", img_size=64,
                                                 depth=2), "timm"),
    SweepModel("swin_tiny", timm_model("swin_tiny_patch4_window7_224", img_size=64, window_size=4,
                                       depths=(1, 1, 1, 1), **_NO_DROP), "timm", train=True, patterns=True),
    SweepModel("beit_base", timm_model("beit_base_patch16_224", img_size=64, depth=2, embed_dim=64,
                                       num_heads=2), "timm", train=True),
    SweepModel("levit_128s", timm_model("levit_128s", size=64, img_size=64), "timm", train=True),
    SweepModel("poolformer_s12", timm_model("poolformer_s12"), "timm"),
    SweepModel("mixer_s16", timm_model("mixer_s16_224", img_size=64), "timm", train=True),
    SweepModel("resmlp_12", timm_model("resmlp_12_224", img_size=64), "timm"),
    SweepModel("densenet121", timm_model("densenet121"), "timm"),
    SweepModel("inception_v3", timm_model("inception_v3", size=80), "timm"),
    SweepModel("dla34", timm_model("dla34"), "timm"),
    SweepModel("cspresnet50", timm_model("cspresnet50"), "timm"),
    SweepModel("rexnet_100", timm_model("rexnet_100"), "timm"),
    SweepModel("coatnet_nano_rw", timm_model("coatnet_nano_rw_224", img_size=64), "timm"),
    SweepModel("maxvit_nano_rw", timm_model("maxvit_nano_rw_256", img_size=64), "timm"),
    SweepModel("repvgg_a0", timm_model("repvgg_a0"), "timm"),
    SweepModel("mnasnet_small", timm_model("mnasnet_small"), "timm"),
    SweepModel("tf_efficientnet_b0", timm_model("tf_efficientnet_b0"), "timm"),
    SweepModel("nf_resnet26", timm_model("nf_resnet26"), "timm"),
    SweepModel("mobilevit_xxs", timm_model("mobilevit_xxs"), "timm"),
    SweepModel("edgenext_xx_small", timm_model("edgenext_xx_small"), "timm"),
    SweepModel("cait_xxs24", timm_model("cait_xxs24_224", img_size=64, depth=2), "timm"),
    SweepModel("xcit_nano_12", timm_model("xcit_nano_12_p16_224", img_size=64, depth=2), "timm"),
    SweepModel("pit_ti", timm_model("pit_ti_224", img_size=64), "timm"),
    SweepModel("gmlp_ti16", timm_model("gmlp_ti16_224", img_size=64), "timm"),
    SweepModel("res2net50_26w_4s", timm_model("res2net50_26w_4s"), "timm"),
    SweepModel("lcnet_050", timm_model("lcnet_050"), "timm"),
    SweepModel("mobileone_s0", timm_model("mobileone_s0"), "timm"),
    SweepModel("fastvit_t8", timm_model("fastvit_t8"), "timm"),
    SweepModel("eva02_tiny", timm_model("eva02_tiny_patch14_224", size=56, img_size=56, depth=2),
               "timm"),
    SweepModel("efficientvit_b0", timm_model("efficientvit_b0"), "timm"),
    SweepModel("sequencer2d_s", timm_model("sequencer2d_s", layers=(1, 1, 1, 1)), "timm"),
    SweepModel("pvt_v2_b0", timm_model("pvt_v2_b0"), "timm"),
    SweepModel("botnet26t", timm_model("botnet26t_256", img_size=64), "timm"),
    SweepModel("resnest14d", timm_model("resnest14d"), "timm"),
    SweepModel("dpn68", timm_model("dpn68"), "timm"),
    SweepModel("ese_vovnet19b_dw", timm_model("ese_vovnet19b_dw"), "timm"),
    SweepModel("regnety_002", timm_model("regnety_002", **_NO_DROP), "timm", train=True, patterns=True),
    SweepModel("hgnetv2_b0", timm_model("hgnetv2_b0"), "timm"),
    SweepModel("xception41", timm_model("xception41"), "timm"),
    SweepModel("skresnet18", timm_model("skresnet18"), "timm"),
    SweepModel("convit_tiny", timm_model("convit_tiny", img_size=64, depth=2), "timm"),
    SweepModel("hrnet_w18_small", timm_model("hrnet_w18_small"), "timm"),
    # ---- transformers: encoders
    SweepModel("bert", hf_model("BertConfig", "BertModel", **_BERTLIKE), "transformers",
               train=True, patterns=True),
    SweepModel("roberta", hf_model("RobertaConfig", "RobertaModel", **_BERTLIKE), "transformers"),
    SweepModel("distilbert", hf_model("DistilBertConfig", "DistilBertModel", vocab_size=VOCAB,
                                      dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                      max_position_embeddings=64, dropout=0.0,
                                      attention_dropout=0.0), "transformers", train=True),
    SweepModel("albert", hf_model("AlbertConfig", "AlbertModel", embedding_size=16, **_BERTLIKE),
               "transformers", train=True),
    SweepModel("electra", hf_model("ElectraConfig", "ElectraModel", embedding_size=16,
                                   **_BERTLIKE), "transformers", train=True),
    SweepModel("deberta_v2", hf_model("DebertaV2Config", "DebertaV2Model", **_BERTLIKE),
               "transformers", train=True, patterns=True),
    SweepModel("mpnet", hf_model("MPNetConfig", "MPNetModel", **_BERTLIKE), "transformers", train=True),
    SweepModel("xlnet", hf_model("XLNetConfig", "XLNetModel", vocab_size=VOCAB, d_model=32,
                                 n_layer=2, n_head=2, d_inner=64, dropout=0.0, use_mems_eval=False),
               "transformers", train=True),
    SweepModel("squeezebert", hf_model("SqueezeBertConfig", "SqueezeBertModel", embedding_size=32,
                                       q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
                                       intermediate_groups=2, output_groups=2, **_BERTLIKE),
               "transformers"),
    SweepModel("mobilebert", hf_model("MobileBertConfig", "MobileBertModel", embedding_size=16,
                                      intra_bottleneck_size=16, num_feedforward_networks=2,
                                      **_BERTLIKE), "transformers"),
    SweepModel("convbert", hf_model("ConvBertConfig", "ConvBertModel", embedding_size=32,
                                    **_BERTLIKE), "transformers"),
    SweepModel("roformer", hf_model("RoFormerConfig", "RoFormerModel", embedding_size=32,
                                    **_BERTLIKE), "transformers", train=True),
    SweepModel("funnel", hf_model("FunnelConfig", "FunnelModel", vocab_size=VOCAB, d_model=32,
                                  n_head=2, d_head=16, d_inner=64, block_sizes=[1, 1],
                                  hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0),
               "transformers"),
    SweepModel("big_bird", hf_model("BigBirdConfig", "BigBirdModel", attention_type="original_full",
                                    **_BERTLIKE), "transformers"),
    # ---- transformers: decoders
    SweepModel("gpt2", hf_model("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_embd=32,
                                n_layer=2, n_head=2, n_positions=64, use_cache=False,
                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
               "transformers", train=True, patterns=True),
    SweepModel("gpt_neo", hf_model("GPTNeoConfig", "GPTNeoForCausalLM", vocab_size=VOCAB,
                                   hidden_size=32, num_layers=2, num_heads=2,
                                   attention_types=[[["global", "local"], 1]], window_size=8,
                                   max_position_embeddings=64, use_cache=False, resid_dropout=0.0,
                                   embed_dropout=0.0, attention_dropout=0.0), "transformers", train=True),
    SweepModel("gptj", hf_model("GPTJConfig", "GPTJForCausalLM", vocab_size=VOCAB, n_embd=32,
                                n_layer=2, n_head=2, rotary_dim=8, n_positions=64, use_cache=False,
                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0), "transformers"),
    SweepModel("opt", hf_model("OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=32,
                               num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                               max_position_embeddings=64, word_embed_proj_dim=32, use_cache=False,
                               dropout=0.0, attention_dropout=0.0), "transformers", train=True),
    SweepModel("bloom", hf_model("BloomConfig", "BloomForCausalLM", vocab_size=VOCAB,
                                 hidden_size=32, n_layer=2, n_head=2, use_cache=False,
                                 hidden_dropout=0.0, attention_dropout=0.0), "transformers", train=True),
    SweepModel("falcon", hf_model("FalconConfig", "FalconForCausalLM", vocab_size=VOCAB,
                                  hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  use_cache=False, hidden_dropout=0.0, attention_dropout=0.0),
               "transformers", train=True),
    SweepModel("llama", hf_model("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=1,
                                 **_DECODER), "transformers", train=True, patterns=True),
    SweepModel("mistral", hf_model("MistralConfig", "MistralForCausalLM", num_key_value_heads=1,
                                   sliding_window=8, **_DECODER), "transformers", train=True, patterns=True),
    SweepModel("qwen2", hf_model("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=1,
                                 **_DECODER), "transformers"),
    SweepModel("gemma", hf_model("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1,
                                 head_dim=16, **_DECODER), "transformers", train=True),
    SweepModel("gemma2", hf_model("Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=1,
                                  head_dim=16, sliding_window=8, **_DECODER), "transformers"),
    SweepModel("phi", hf_model("PhiConfig", "PhiForCausalLM", resid_pdrop=0.0, embd_pdrop=0.0,
                               attention_dropout=0.0, **_DECODER), "transformers", train=True),
    SweepModel("phi3", hf_model("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=1,
                                pad_token_id=0, **_DECODER), "transformers"),
    SweepModel("gpt_neox", hf_model("GPTNeoXConfig", "GPTNeoXForCausalLM", hidden_dropout=0.0,
                                    attention_dropout=0.0, **_DECODER), "transformers"),
    SweepModel("mixtral", hf_model("MixtralConfig", "MixtralForCausalLM", num_key_value_heads=1,
                                   num_local_experts=4, num_experts_per_tok=2, **_DECODER),
               "transformers"),
    SweepModel("qwen3", hf_model("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=1,
                                 head_dim=16, **_DECODER), "transformers", train=True),
    SweepModel("olmo", hf_model("OlmoConfig", "OlmoForCausalLM", num_key_value_heads=1,
                                **_DECODER), "transformers"),
    SweepModel("cohere", hf_model("CohereConfig", "CohereForCausalLM", num_key_value_heads=1,
                                  **_DECODER), "transformers"),
    SweepModel("stablelm", hf_model("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=1,
                                    **_DECODER), "transformers"),
    SweepModel("starcoder2", hf_model("Starcoder2Config", "Starcoder2ForCausalLM",
                                      num_key_value_heads=1, residual_dropout=0.0,
                                      embedding_dropout=0.0, **_DECODER), "transformers"),
    SweepModel("codegen", hf_model("CodeGenConfig", "CodeGenForCausalLM", vocab_size=VOCAB,
                                   n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64,
                                   n_ctx=64, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0,
                                   attn_pdrop=0.0), "transformers"),
    SweepModel("ctrl", hf_model("CTRLConfig", "CTRLLMHeadModel", vocab_size=VOCAB, n_embd=32,
                                n_layer=2, n_head=2, dff=64, n_positions=64, use_cache=False,
                                resid_pdrop=0.0, embd_pdrop=0.0), "transformers"),
    # ---- transformers: encoder-decoders
    SweepModel("t5", hf_model("T5Config", "T5ForConditionalGeneration", decoder=True,
                              vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                              num_heads=2, dropout_rate=0.0, use_cache=False),
               "transformers", train=True, patterns=True),
    SweepModel("bart", hf_model("BartConfig", "BartForConditionalGeneration", decoder=True,
                                vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                                encoder_attention_heads=2, decoder_attention_heads=2,
                                encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                                dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                use_cache=False), "transformers", train=True, patterns=True),
    SweepModel("mbart", hf_model("MBartConfig", "MBartForConditionalGeneration", decoder=True,
                                 **_BART), "transformers"),
    SweepModel("pegasus", hf_model("PegasusConfig", "PegasusForConditionalGeneration",
                                   decoder=True, **_BART), "transformers"),
    SweepModel("marian", hf_model("MarianConfig", "MarianMTModel", decoder=True,
                                  decoder_start_token_id=0, pad_token_id=0, **_BART),
               "transformers"),
    SweepModel("blenderbot_small", hf_model("BlenderbotSmallConfig",
                                            "BlenderbotSmallForConditionalGeneration",
                                            decoder=True, **_BART), "transformers"),
    # ---- transformers: vision
    SweepModel("hf_vit", hf_vision("ViTConfig", "ViTModel", image_size=64, patch_size=16,
                                   **_VISION), "transformers", train=True),
    SweepModel("hf_swin", hf_vision("SwinConfig", "SwinModel", image_size=64, patch_size=4,
                                    embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4,
                                    drop_path_rate=0.0, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0), "transformers"),
    SweepModel("hf_convnext", hf_vision("ConvNextConfig", "ConvNextModel", num_stages=2,
                                        hidden_sizes=[16, 32], depths=[1, 1], image_size=64), "transformers"),
    SweepModel("hf_resnet", hf_vision("ResNetConfig", "ResNetModel", embedding_size=16,
                                      hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"),
               "transformers", train=True, patterns=True),
    SweepModel("segformer", hf_vision("SegformerConfig", "SegformerModel", num_encoder_blocks=2,
                                      depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                      num_attention_heads=[1, 2], patch_sizes=[7, 3],
                                      strides=[4, 2], mlp_ratios=[2, 2], hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, drop_path_rate=0.0),
               "transformers"),
    SweepModel("mobilevit_hf", hf_vision("MobileViTConfig", "MobileViTModel", image_size=64,
                                         hidden_sizes=[32, 40, 48], neck_hidden_sizes=[8, 8, 16, 16,
                                                                                     24, 32, 64],
                                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
               "transformers"),
]


# ------------------------------------------------------------------------------ one check


class Timeout(BaseException):
    """A model over its time budget: a BaseException, so that no ``except Exception`` of the
    compiler (which would run the frame eagerly and go on) swallows it."""


class EagerFailed(Exception):
    """The model fails in eager PyTorch (timm's size asserts, ...): not kiln's error."""


def _eager(fn, *args):
    try:
        return fn(*args)
    except Exception as e:
        raise EagerFailed(first_line(e, 160)) from e


def _on_alarm(signum, frame):
    raise Timeout("over its time budget")


class Counting:
    """What the frontend and kiln did between ``__enter__`` and ``__exit__``: frontend graphs
    and graph breaks (kiln_frontend's convert observers), frames whose compile failed and ran
    eagerly (the frontend suppresses the error: the observers see it), and ``kiln.stats()``
    deltas."""

    def __enter__(self):
        import kiln
        from kiln_frontend import convert

        self.graphs = self.breaks = 0
        self.failures: list[str] = []
        self.break_reasons: list[str] = []
        self.before = kiln.stats()
        self._observer = self.observe
        convert.observers.append(self._observer)
        return self

    def observe(self, frame_info, compiled, reason, seconds):
        from kiln_frontend.exc import Unsupported

        if compiled is None:
            if isinstance(reason, Unsupported):
                self.breaks += 1
                self.break_reasons.append(str(reason.reason)[:80])
            elif reason is not None:
                self.failures.append(first_line(reason, 160))
            return
        self.graphs += len(compiled.graphs)
        self.breaks += len(compiled.graph_breaks)
        self.break_reasons += [str(e.reason)[:80] for e in compiled.graph_breaks]

    def __exit__(self, *exc):
        import kiln
        from kiln_frontend import convert

        convert.observers.remove(self._observer)
        after = kiln.stats()
        b = self.before
        self.counts = {
            "graphs": self.graphs,
            "graph_breaks": self.breaks,
            "compile_failures": len(self.failures),
            "kiln_graphs_compiled": after.graphs_compiled - b.graphs_compiled,
            "eager_fallbacks": after.eager_fallbacks - b.eager_fallbacks,
            "aten_fallbacks": sum(v - b.aten_fallbacks.get(k, 0)
                                  for k, v in after.aten_fallbacks.items()),
            "interpreter_fallbacks": after.interpreter_fallbacks - b.interpreter_fallbacks,
        }
        reasons = {k: v - b.fallback_reasons.get(k, 0) for k, v in after.fallback_reasons.items()}
        aten = {k.split("::")[-1]: v - b.aten_fallbacks.get(k, 0)
                for k, v in after.aten_fallbacks.items()}
        self.details = {
            "fallback_reasons": {k: v for k, v in reasons.items() if v},
            "aten_fallback_ops": sorted(k for k, v in aten.items() if v),
            "break_reasons": sorted(set(self.break_reasons)),
            "failures": self.failures,
        }
        return False


def _fresh_compile(model: nn.Module):
    import kiln
    import kiln_frontend

    kiln_frontend.reset()
    return kiln.compile(model)


def _max_abs_diff(got: list, want: list) -> float:
    if len(got) != len(want):
        return float("nan")
    diffs = [(g.float() - w.float()).abs().max().item() for g, w in zip(got, want, strict=True)
             if g.shape == w.shape and g.numel()]
    return max(diffs, default=float("nan"))


#: kiln's error against a float64 run may be this many times eager's float32 error
NOISE_FACTOR = 10.0


def _compare(got: list, want: list, what: str, exact: list | None = None) -> str | None:
    """None when they match, else ``WRONG (<what>: max abs diff ...)``. With ``exact`` (the
    same values from a float64 run), a mismatch that is float32 noise passes: kiln's max error
    against ``exact`` is at most ``NOISE_FACTOR`` times eager's own, or within ``ATOL`` (deep
    nets with training-mode BatchNorm: eager float32 itself is 3e-3 off on gradients of 80)."""
    try:
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL, equal_nan=True)
    except AssertionError as e:
        if exact is not None and len(exact) == len(got):
            kiln_err = _max_abs_diff([g.double() for g in got], exact)
            eager_err = _max_abs_diff([w.double() for w in want], exact)
            if kiln_err <= max(NOISE_FACTOR * eager_err, ATOL):
                return None
            noise = f"; vs float64: kiln {kiln_err:.3g}, eager {eager_err:.3g}"
        else:
            noise = ""
        detail = " ".join(x.strip() for x in str(e).splitlines() if x.strip())[:200]
        return f"WRONG ({what}: max abs diff {_max_abs_diff(got, want):.3g}{noise}; {detail})"
    return None


def _float64(model: nn.Module, inputs: tuple):
    """A float64 copy of ``model`` and ``inputs`` (None where the model refuses float64)."""
    try:
        return (copy.deepcopy(model).double(),
                tuple(i.double() if i.is_floating_point() else i for i in inputs))
    except Exception:
        return None, None


def check_inference(model: nn.Module, make_inputs) -> str:
    model.eval()
    inputs = make_inputs(BATCH)
    with torch.no_grad():
        want = tensors_of(_eager(model, *inputs))
        got = tensors_of(_fresh_compile(model)(*inputs))
        if _compare(got, want, "output") is None:
            return "ok"
        m64, in64 = _float64(model, inputs)
        exact = None if m64 is None else tensors_of(m64(*in64))
    return _compare(got, want, "output", exact) or "ok"


def _loss(out) -> torch.Tensor:
    return sum((t if t.dtype == torch.float64 else t.float()).square().mean()
               for t in tensors_of(out) if t.is_floating_point())


def check_training(model: nn.Module, make_inputs) -> str:
    model.train()
    ref = copy.deepcopy(model)
    inputs = make_inputs(BATCH)
    m64, in64 = _float64(model, inputs)
    ref_loss = _loss(_eager(ref, *inputs))
    ref_loss.backward()
    loss = _loss(_fresh_compile(model)(*inputs))
    loss.backward()
    loss64 = None
    if m64 is not None:
        loss64 = _loss(m64(*in64))
        loss64.backward()
    p64 = dict(m64.named_parameters()) if m64 is not None else {}
    b64 = dict(m64.named_buffers()) if m64 is not None else {}

    def exact(t) -> list | None:
        return None if t is None else [t.detach()]

    bad = _compare([loss], [ref_loss], "loss", exact(loss64))
    if bad:
        return bad
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        if q.grad is None:
            if p.grad is not None and p.grad.any():
                return f"WRONG ({name}.grad: eager has none, kiln's is nonzero)"
            continue
        if p.grad is None:
            return f"WRONG ({name}.grad: None, eager's is not)"
        bad = _compare([p.grad], [q.grad], f"{name}.grad",
                       exact(getattr(p64.get(name), "grad", None)))
        if bad:
            return bad
    for (name, b), (_, c) in zip(model.named_buffers(), ref.named_buffers(), strict=True):
        if c.is_floating_point():
            bad = _compare([b], [c], f"buffer {name}", exact(b64.get(name)))
            if bad:
                return bad
    return "ok"


def check_patterns(model: nn.Module, make_inputs) -> str:
    """Batch size and image size / sequence length changes, train/eval toggling, an in-place
    parameter change, a compiled training step (forward, backward, SGD) then evaluation, each
    checked against eager on the model as it is at that call."""
    model.eval()
    compiled = _fresh_compile(model)

    def same(label: str, batch: int, other_size: bool = False) -> str | None:
        inputs = make_inputs(batch, other_size)
        with torch.no_grad():
            try:
                want = tensors_of(_eager(model, *inputs))
            except EagerFailed:
                if other_size:  # a model of one fixed input size (timm's ViTs): step skipped
                    return None
                raise
            got = tensors_of(compiled(*inputs))
        return _compare(got, want, label)

    def train_step() -> None:
        model.train()
        _loss(compiled(*make_inputs(BATCH))).backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(0.1 * p.grad)
        model.zero_grad(set_to_none=True)
        model.eval()

    steps: list[tuple[str, Callable[[], None], int, bool]] = [
        ("first call", lambda: None, BATCH, False),
        ("batch 3", lambda: None, 3, False),
        ("batch 2 again", lambda: None, BATCH, False),
        ("other image size / sequence length", lambda: None, BATCH, True),
        ("after train()", lambda: model.train(), BATCH, False),
        ("after eval()", lambda: model.eval(), BATCH, False),
        ("after p.mul_(0.5)", lambda: _scale_first_weight(model), BATCH, False),
        ("batch 3 after p.mul_", lambda: None, 3, False),
        ("eval after a compiled training step", train_step, BATCH, False),
    ]
    for label, before, batch, other_size in steps:
        before()
        bad = same(label, batch, other_size)
        if bad:
            return bad
    return "ok"


def _scale_first_weight(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(0.5)
                return


CHECKS = {"infer": check_inference, "train": check_training, "patterns": check_patterns}


def _on_device(model: nn.Module, make_inputs):
    """``model`` moved to ``DEVICE``, and ``make_inputs`` giving its tensors there (token ids
    too); unchanged on the CPU."""
    if DEVICE.type == "cpu":
        return model, make_inputs

    def inputs(b, other_size=False):
        return tuple(t.to(DEVICE) if isinstance(t, torch.Tensor) else t
                     for t in make_inputs(b, other_size))

    return model.to(DEVICE), inputs


def _cuda_alive() -> bool:
    """False when the CUDA context is broken (an illegal memory access, a device-side
    assert: sticky, every later CUDA call fails)."""
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device=DEVICE).add(1).item() == 2.0
    except Exception:
        return False


def run_mode(m: SweepModel, mode: str, timeout: float, capped: bool = False) -> dict:
    """One check; ``capped``: ``timeout`` is what was left of ``--budget``, not ``--timeout``."""
    row: dict[str, Any] = {"model": m.name, "source": m.source, "mode": mode}
    torch.manual_seed(0)
    t0 = time.perf_counter()
    try:
        model, make_inputs = m.build()
    except Exception as e:
        row.update(result="skipped (build)", error=first_line(e, 160),
                   seconds=round(time.perf_counter() - t0, 1))
        return row
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    counting = Counting()
    try:
        model, make_inputs = _on_device(model, make_inputs)
        with counting:
            result = CHECKS[mode](model, make_inputs)
    except Timeout:
        result = f"timeout ({timeout:.0f} s{', the end of --budget' if capped else ''})"
    except EagerFailed as e:
        result = f"skipped (eager fails: {e})"
    except torch.cuda.OutOfMemoryError as e:
        result = f"error (CUDA out of memory: {first_line(e, 160)})"
        row["traceback"] = traceback.format_exc(limit=-6)
    except Exception as e:
        result = f"error ({first_line(e, 160)})"
        row["traceback"] = traceback.format_exc(limit=-6)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    row.update(getattr(counting, "counts", {}))
    row.update(getattr(counting, "details", {}))
    if result == "ok" and row.get("compile_failures"):
        result = "error (a frame's compile failed; it ran eagerly: " + row["failures"][0] + ")"
    row["result"] = result
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


# ------------------------------------------------------------------------------ the report


def _kind(result: str) -> str:
    if result.startswith(("not run", "not finished")):
        return result.split(" (", 1)[0]
    return result.split(" ", 1)[0] if not result.startswith("skipped") else "skipped"


def _notes(r: dict) -> str:
    parts = ["the CUDA context was broken after it"] if r.get("cuda_context_broken") else []
    if r.get("fallback_reasons"):
        parts.append("eager: " + ", ".join(f"{k} x{v}" for k, v in r["fallback_reasons"].items()))
    if r.get("aten_fallback_ops"):
        parts.append("aten: " + ", ".join(r["aten_fallback_ops"]))
    if r.get("break_reasons"):
        parts.append("breaks: " + "; ".join(r["break_reasons"])[:160])
    return " / ".join(parts)


def report(rows: list[dict]) -> str:
    header = ["model", "mode", "result", "graphs", "breaks", "eager fb", "aten fb", "s", "notes"]
    table = [[r["model"], r["mode"], r["result"][:110], r.get("graphs", ""),
              r.get("graph_breaks", ""), r.get("eager_fallbacks", ""), r.get("aten_fallbacks", ""),
              r.get("seconds", ""), _notes(r)] for r in rows]
    counts: dict[str, int] = {}
    for r in rows:
        counts[_kind(r["result"])] = counts.get(_kind(r["result"]), 0) + 1
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    return markdown_table(header, table) + f"\n\nTotals over {len(rows)} checks: {summary}\n"


def _device_label() -> str:
    """For the report's title: ``CPU`` or ``CUDA: <the GPU's name>``."""
    if DEVICE.type == "cuda":
        return f"CUDA: {torch.cuda.get_device_name(DEVICE)}, TF32 off"
    return DEVICE.type.upper()


def _restart(argv: list[str], state: dict, out: Path) -> None:
    """A fresh process (a new CUDA context) for the checks left: this run's rows, the budget
    clock and the cache go to it through ``--resume``."""
    resume = out.parent / f"{out.name}.resume.json"
    resume.write_text(json.dumps(state, default=str))
    args = [sys.executable, "-u", str(Path(__file__).resolve()), *argv, "--resume", str(resume)]
    if not any(a == "--cache-dir" or a.startswith("--cache-dir=") for a in argv):
        args += ["--cache-dir", os.environ["KILN_CACHE_DIR"]]
    print(f"the CUDA context is broken: starting again on the checks left ({' '.join(args[2:])})",
          flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, args)


def main(argv=None) -> int:
    global DEVICE
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated model names")
    p.add_argument("--no-train", action="store_true", help="inference (and patterns) only")
    p.add_argument("--no-patterns", action="store_true", help="skip the user-pattern checks")
    p.add_argument("--no-infer", action="store_true", help="skip the inference checks (training only, say)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per model and mode")
    p.add_argument("--cache-dir", default="", help="KILN_CACHE_DIR (default: a fresh temp dir)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where models, inputs and eager's reference run (cuda: TF32 off)")
    p.add_argument("--budget", type=float, default=0.0,
                   help="seconds for the whole run: no check starts after that (0: no limit)")
    p.add_argument("--order", choices=("model", "mode"), default=None,
                   help="model: each model's modes together; mode: every inference check, then "
                        "training, then patterns (default: mode with --budget, else model)")
    p.add_argument("--out", default=None,
                   help="results file stem under benchmarks/results (default: model-sweep, "
                        "with --device cuda model-sweep-cuda); also written into $OUT when set")
    p.add_argument("--update", action="store_true",
                   help="replace the rows of the models run in the existing results file")
    p.add_argument("--resume", default="", help=argparse.SUPPRESS)  # _restart's state file
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw_argv)
    if args.resume:  # the command as the user gave it, without _restart's additions
        k = raw_argv.index("--resume")
        raw_argv = raw_argv[:k]
    only = [x for x in args.only.split(",") if x]
    unknown = set(only) - {m.name for m in MODELS}
    if unknown:
        p.error(f"unknown models: {', '.join(sorted(unknown))}")
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
        # float32 is float32 for eager and kiln alike: no TF32 in cuBLAS matmuls or cuDNN convs
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    label = _device_label()  # once: a broken CUDA context fails even get_device_name
    os.environ["KILN_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="kiln-sweep-")
    order = args.order or ("mode" if args.budget else "model")
    todo = [(m, mode) for m in MODELS if not only or m.name in only
            for mode in MODES
            if (mode == "infer" and not args.no_infer) or (mode == "train" and m.train and not args.no_train)
            or (mode == "patterns" and m.patterns and not args.no_patterns)]
    if order == "mode":
        todo.sort(key=lambda t: MODES.index(t[1]))  # stable: models in order within a mode
    out = RESULTS_DIR / (args.out or ("model-sweep-cuda" if DEVICE.type == "cuda" else "model-sweep"))
    copies = [out] + ([Path(os.environ["OUT"]) / out.name] if os.environ.get("OUT") else [])
    command = " ".join(["python", "benchmarks/model_sweep.py", *raw_argv])
    old_rows = None
    if args.resume:
        state = json.loads(Path(args.resume).read_text())
        Path(args.resume).unlink()
        rows, start, old_rows, command = (state["rows"], state["start"], state["old_rows"],
                                          state["command"])
    else:
        rows, start = [], time.time()
        if args.update and out.with_suffix(".json").exists():
            old = json.loads(out.with_suffix(".json").read_text())
            old_rows = old["rows"]
            command = f"{old['meta']['command']}; then {command}"
    done = {(r["model"], r["mode"]) for r in rows}
    old_keys = {(r["model"], r["mode"]) for r in old_rows or ()}
    meta = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tolerance": {"rtol": RTOL, "atol": ATOL},
    }
    if DEVICE.type == "cuda":
        try:
            import triton

            triton_version = triton.__version__
        except Exception as e:  # kiln's Triton codegen then fails each check: the rows say so
            triton_version = f"not importable ({first_line(e)})"
        meta.update(device=label, triton=triton_version,
                    tf32={"matmul": False, "cudnn": False})
    if args.budget:
        meta["budget_s"] = args.budget
    index = {(m.name, mode): i for i, (m, mode) in enumerate(
        (m, mode) for m in MODELS for mode in MODES)}

    def save(pending: list[dict], final: bool = False) -> str:
        """Write the report: this run's rows, then ``pending`` (checks not run, or the one
        running now), merged into the old file's rows with ``--update``."""
        now = rows + pending
        if order == "mode":  # the report reads model by model, as the CPU one
            now = sorted(now, key=lambda r: index[r["model"], r["mode"]])
        if old_rows is not None:  # a check not run here keeps its old row
            new_rows = {(r["model"], r["mode"]): r for r in now
                        if not r["result"].startswith("not ")
                        or (r["model"], r["mode"]) not in old_keys}
            now = [new_rows.pop((r["model"], r["mode"]), r) for r in old_rows] + list(new_rows.values())
        text = report(now)
        meta["seconds"] = round(time.time() - start, 1)
        meta["finished"] = final
        header = (f"# Model correctness sweep: kiln vs eager ({label}, float32)\n\n"
                  f"Command: `{meta['command']}`  \nDate: {meta['date']}; torch {meta['torch']}; ")
        if DEVICE.type == "cuda":
            header += f"triton {meta['triton']}; "
        else:
            header += f"{meta['threads']} threads; "
        header += f"rtol = atol = {RTOL}.\n\n"
        if args.budget:
            header += f"Budget: {args.budget:.0f} s; ran {meta['seconds']:.0f} s.\n\n"
        for stem in copies:
            stem.parent.mkdir(parents=True, exist_ok=True)
            stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": now}, indent=1,
                                                            default=str))
            stem.with_suffix(".md").write_text(header + text)
        return text

    print(f"{len(todo) - len(done)} checks on {label}, order: {order}, timeout "
          f"{args.timeout:.0f} s per check" + (f", budget {args.budget:.0f} s" if args.budget else "")
          + (f" ({len(done)} done before a restart)" if done else ""), flush=True)

    def marker(m: SweepModel, mode: str, result: str) -> dict:
        return {"model": m.name, "source": m.source, "mode": mode, "result": result}

    for i, (m, mode) in enumerate(todo, 1):
        if (m.name, mode) in done:
            continue
        elapsed = time.time() - start
        if args.budget and elapsed >= args.budget:
            left = [(m2, mode2) for m2, mode2 in todo[i - 1:] if (m2.name, mode2) not in done]
            print(f"--budget {args.budget:.0f} s spent ({elapsed:.0f} s): {len(left)} checks not run",
                  flush=True)
            rows.extend(marker(m2, mode2, "not run (budget)") for m2, mode2 in left)
            break
        timeout, capped = args.timeout, False
        if args.budget and args.budget - elapsed + BUDGET_GRACE < timeout:
            timeout, capped = args.budget - elapsed + BUDGET_GRACE, True
        save([marker(m, mode, "not finished (running at the last write)")]
             + [marker(m2, mode2, "not run (not reached)") for m2, mode2 in todo[i:]
                if (m2.name, mode2) not in done])
        row = run_mode(m, mode, timeout, capped)
        rows.append(row)
        done.add((m.name, mode))
        alive = True
        if DEVICE.type == "cuda":
            import kiln_frontend

            kiln_frontend.reset()  # compiled frames hold the model: let its memory go
            gc.collect()
            alive = _cuda_alive()
            if alive:
                torch.cuda.empty_cache()
            else:
                row["cuda_context_broken"] = True
        counts = " ".join(f"{k}={row[k]}" for k in ("graphs", "graph_breaks", "eager_fallbacks",
                                                   "aten_fallbacks") if k in row)
        print(f"[{i}/{len(todo)} {time.time() - start:5.0f}s] {m.name:<22} {mode:<8} "
              f"{row['seconds']:>6.1f}s {row['result'][:140]}  {counts}", flush=True)
        if not alive and i < len(todo):
            save([marker(m2, mode2, "not run (not reached)") for m2, mode2 in todo[i:]
                  if (m2.name, mode2) not in done])
            _restart(raw_argv, {"rows": rows, "start": start, "old_rows": old_rows,
                                "command": command}, out)
    text = save([], final=True)
    print("\n" + text)
    print(f"results in {' and '.join(str(c) for c in copies)} (.json / .md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
