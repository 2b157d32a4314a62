"""builder/vision_qwen.py's graph against transformers' Qwen2.5-VL and Qwen2-VL image features: several images
packed in one run, grids that do not fill whole windows, a video's two frames; the graph's inputs, the
ONNX checker and the TensorRT op lint; the wrong feeds that must fail; what spec_of refuses."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest

from tests.tiny_qwen_vl import make_qwen_vl_checkpoint

GRIDS = [
    ((1, 8, 12), (1, 4, 4)),  # two images in one run
    ((1, 6, 10),),            # 6 x 10 patches: windows are 4 x 4 patches, so the last row and column are partial
    ((2, 4, 6), (1, 10, 2)),  # a two-frame video (each frame its own segment) and a thin image
]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl"])
def built(request, tmp_path_factory):
    """(the model, its spec, the written graph, vision.onnx saved and linted as export.py saves it)."""
    import torch
    import transformers

    from trtllm.builder import vision_qwen
    from trtllm.builder.export import save_linted

    out = tmp_path_factory.mktemp(request.param)
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        make_qwen_vl_checkpoint(out / "ckpt", kind=request.param), dtype=torch.float32).eval()
    spec = vision_qwen.spec_of(model.config)
    graph = vision_qwen.QwenVisionWriter(spec, vision_qwen.weights_of(model)).write()
    save_linted(copy.deepcopy(graph), out, "vision.onnx", "the vision graph", "11.1")  # raises on a lint issue
    return model, spec, graph, out / "vision.onnx"


@pytest.mark.parametrize("grids", GRIDS, ids=["two_images", "partial_windows", "video+thin"])
def test_vision_graph_matches_transformers(built, grids):
    from trtllm.builder import vision_qwen

    model, spec, _, path = built
    report = vision_qwen.verify(path, model, spec, grids=grids)
    assert report["max_abs_error"] <= 1e-4 * max(1.0, report["max_abs_value"])
    assert report["grids"] == [list(g) for g in grids]


def test_graph_inputs_outputs_and_checker(built):
    from trtllm.builder import vision_qwen as vq

    model, spec, graph, _ = built
    onnx.checker.check_model(graph)
    names = [i.name for i in graph.graph.input]
    windowed = [vq.WINDOW_ROWS, vq.WINDOW_SLOTS] if spec.model_type == "qwen2_5_vl" else []
    assert names == [vq.PIXELS, vq.POSITIONS, vq.IMAGE_IDS, *windowed]
    assert [o.name for o in graph.graph.output] == [vq.EMBEDS]
    dims = [d.dim_value or d.dim_param for d in graph.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["image_tokens", model.config.text_config.hidden_size]
    assert spec.patch_dim == 3 * 2 * 14 * 14


@pytest.mark.parametrize("wrong", ["unpermuted_rows", "one_window", "one_image"])
def test_wrong_inputs_are_caught(built, monkeypatch, wrong):
    """The deliberately wrong variants: rows left in the processor's order, every row in one window, or
    both images in one segment must fail verify (Qwen2-VL has no windows: only the last applies)."""
    from trtllm.builder import vision_qwen as vq

    model, spec, _, path = built
    if wrong != "one_image" and spec.window_size is None:
        pytest.skip("Qwen2-VL's rows are in the processor's order, and it has no windows")
    real = vq._inputs

    def broken(grids, s):
        feeds = real(grids, s)
        if wrong == "unpermuted_rows":
            feeds["rows"] = np.arange(len(feeds["rows"]))
        else:
            key = vq.WINDOW_IDS if wrong == "one_window" else vq.IMAGE_IDS
            feeds[key] = np.ones_like(feeds[key])
        return feeds

    monkeypatch.setattr(vq, "_inputs", broken)
    with pytest.raises(RuntimeError, match="differ from transformers"):
        vq.verify(path, model, spec, grids=GRIDS[0])


@pytest.mark.parametrize("kind, field, value", [
    ("qwen2_5_vl", "hidden_act", "relu"),
    ("qwen2_5_vl", "fullatt_block_indexes", []),
    ("qwen2_5_vl", "window_size", 14),
    ("qwen2_5_vl", "patch_size", [14, 14]),
    ("qwen2_vl", "hidden_act", "gelu_fast"),
    ("qwen2_vl", "embed_dim", 36),
])
def test_spec_of_refuses_by_field(kind, field, value):
    import transformers

    from tests.tiny_qwen_vl import KINDS, vision_config
    from trtllm.builder import vision_qwen
    from trtllm.builder.config import Unsupported

    config = getattr(transformers, KINDS[kind][0])(vision_config=vision_config(kind), text_config={"hidden_size": 64})
    assert vision_qwen.spec_of(config).hidden_size == 32
    object.__setattr__(config.vision_config, field, value)  # (past the strict config's own checks)
    with pytest.raises(Unsupported, match=f"vision_config.{field}"):
        vision_qwen.spec_of(config)
