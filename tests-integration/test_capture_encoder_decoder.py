"""Encoder-decoder and speech models from transformers (issue 10): their ``forward`` deep
copies the config (``get_text_config(decoder=True)``, Whisper's cache config) and builds a
cache object; each is captured in ONE graph with ``fullgraph=True`` and agrees with eager,
including the returned cache (tiny configs, random weights, no downloads)."""

from __future__ import annotations

import kiln_frontend
import pytest
import torch
from kiln_frontend import eval_frame
from test_capture_models import CountingBackend, assert_same

transformers = pytest.importorskip("transformers")

_SEQ2SEQ = {"vocab_size": 128, "d_model": 32, "encoder_layers": 1, "decoder_layers": 2,
            "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64, "max_position_embeddings": 64, "dropout": 0.0}


def _ids(seq: int) -> torch.Tensor:
    return torch.randint(0, 128, (2, seq))


def _build(name: str):
    torch.manual_seed(0)
    T = transformers
    if name == "t5":  # the default config (use_cache=True)
        model = T.T5Model(T.T5Config(vocab_size=128, d_model=32, d_kv=16, d_ff=64,
                                     num_layers=1, num_decoder_layers=2, num_heads=2,
                                     dropout_rate=0.0))
        return model, {"input_ids": _ids(12), "decoder_input_ids": _ids(6)}
    if name == "bart":
        return T.BartModel(T.BartConfig(**_SEQ2SEQ)), \
            {"input_ids": _ids(12), "decoder_input_ids": _ids(6)}
    if name == "mbart":
        return T.MBartModel(T.MBartConfig(**_SEQ2SEQ)), \
            {"input_ids": _ids(12), "decoder_input_ids": _ids(6)}
    assert name == "whisper"
    cfg = T.WhisperConfig(vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=2,
                          encoder_attention_heads=2, decoder_attention_heads=2,
                          encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                          max_source_positions=16, max_target_positions=32, pad_token_id=0,
                          bos_token_id=0, eos_token_id=1, decoder_start_token_id=1,
                          dropout=0.0)
    return T.WhisperModel(cfg), {"input_features": torch.randn(1, 16, 32),
                                 "decoder_input_ids": torch.randint(0, 128, (1, 5))}


@pytest.fixture(autouse=True)
def _fresh():
    kiln_frontend.reset()
    yield
    kiln_frontend.reset()


@pytest.mark.parametrize("name", ["t5", "bart", "mbart", "whisper"])
def test_encoder_decoder_one_graph(name):
    model, kwargs = _build(name)
    model.eval()
    config_before = model.config.to_dict()
    backend = CountingBackend()
    compiled = kiln_frontend.compile(model, backend=backend, fullgraph=True)
    with torch.no_grad():
        expected = model(**kwargs)
        actual = compiled(**kwargs)
        assert len(backend.graphs) == 1
        assert_same(actual, expected, atol=1e-5, rtol=1e-4)
        converts = eval_frame.counters["converts"]
        again = compiled(**kwargs)
    assert_same(again, expected, atol=1e-5, rtol=1e-4)
    assert len(backend.graphs) == 1 and eval_frame.counters["converts"] == converts
    assert model.config.to_dict() == config_before  # the copies were copies
