"""builder/vision.py's graph against transformers' InternVL image features, for each kind of encoder
layer it writes; and what a vision-language build refuses."""
from __future__ import annotations

import numpy as np
import pytest

from tests.tiny_vlm import make_vlm_checkpoint


def image_features(ckpt, tiles: int = 3, **config) -> tuple[np.ndarray, np.ndarray]:
    """(ours through ONNX Runtime, transformers') for random pixels."""
    import onnxruntime as ort
    import torch
    import transformers

    from trtllm.builder import vision

    model = transformers.AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()
    for key, value in config.items():  # (set after loading: the layers they change are rebuilt below)
        setattr(model.config.vision_config, key, value)
    if config:
        torch.manual_seed(1)
        model.model.vision_tower = transformers.AutoModel.from_config(model.config.vision_config).eval()
        with torch.no_grad():
            for name, p in model.model.vision_tower.named_parameters():
                p.copy_(torch.randn_like(p) * (0.1 if "bias" in name else 1.0) / p.shape[-1] ** 0.5
                        + (1.0 if name.endswith("norm.weight") else 0.0))
    spec = vision.spec_of(model.config)
    graph = vision.VisionWriter(spec, vision.weights_of(model)).write()
    pixels = np.random.default_rng(0).standard_normal((tiles, 3, *spec.image_size)).astype(np.float32)
    ours = ort.InferenceSession(graph.SerializeToString()).run(None, {vision.PIXELS: pixels})[0]
    with torch.no_grad():
        ref = model.model.get_image_features(torch.from_numpy(pixels), return_dict=True).pooler_output
    return ours, ref.reshape(-1, spec.out_hidden).numpy()


@pytest.mark.parametrize("config", [
    {},
    {"norm_type": "rms_norm", "use_qk_norm": True},  # InternViT-6B's kind
    {"use_mean_pooling": False, "hidden_act": "gelu_pytorch_tanh"},  # a final LayerNorm; tanh GELU
], ids=["layer_norm", "rms_norm+qk_norm", "final_norm+tanh"])
def test_vision_graph_matches_transformers(tmp_path, config):
    ours, ref = image_features(make_vlm_checkpoint(tmp_path), **config)
    assert ours.shape == ref.shape == (3 * 4, 64)
    np.testing.assert_allclose(ours, ref, atol=1e-4 * max(1.0, float(np.abs(ref).max())))


def test_a_wrong_pixel_shuffle_is_caught(tmp_path, monkeypatch):
    """The deliberately wrong variant: the shuffle's first transpose left out must fail the comparison."""
    from trtllm.builder import vision

    real = vision.VisionWriter.pixel_shuffle

    def wrong(self, x):
        g = self.g
        original = g.op
        g.op = lambda op, name, *a, **k: a[0][0] if name == "/vision/shuffle/Transpose0" else original(op, name, *a, **k)
        try:
            return real(self, x)
        finally:
            g.op = original

    monkeypatch.setattr(vision.VisionWriter, "pixel_shuffle", wrong)
    ours, ref = image_features(make_vlm_checkpoint(tmp_path))
    assert ours.shape == ref.shape
    assert not np.allclose(ours, ref, atol=1e-3)


def test_a_hub_id_loads_as_a_vision_language_model(tmp_path, monkeypatch):
    """A hub ID's checkpoint is split as a directory's is (the files here come from a local one)."""
    from trtllm.builder import checkpoint as ckpt

    local, real = make_vlm_checkpoint(tmp_path), ckpt.load_model
    monkeypatch.setattr(ckpt, "load_model", lambda source, model_arg: real(local, model_arg))
    ck = ckpt.load("example/InternVL-tiny-hf")
    assert ck.source["kind"] == "hub" and type(ck.vision).__name__ == "InternVLForConditionalGeneration"
    assert type(ck.model).__name__ == "Qwen2ForCausalLM"
    assert ck.model.model is ck.vision.model.language_model  # (the same modules: nothing copied)
