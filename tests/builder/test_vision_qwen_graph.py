"""builder/vision_qwen.py's graph against transformers' Qwen2.5-VL, Qwen2-VL and Qwen3-VL image features
(Qwen3-VL's deepstack features beside them): several images packed in one run, grids that do not fill
whole windows, a video's two frames, grids larger and smaller than Qwen3-VL's learned position grid; the
graph's inputs, the ONNX checker and the TensorRT op lint; the wrong feeds that must fail; what spec_of
refuses; the manifest section's deepstack and M-RoPE keys."""
from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest

from tests.tiny_qwen_vl import make_qwen_vl_checkpoint


def cpu_missing() -> str:
    from trtllm.plugins import cpu

    return f"vision.ort.onnx needs our CPU kernels: {cpu.missing_hint()}"

# (sides even: whole 2 x 2 merge units; Qwen3-VL's learned grid is 4 x 4 patches, resampled to each)
GRIDS = [
    ((1, 8, 12), (1, 4, 4)),  # two images in one run
    ((1, 6, 10),),            # 6 x 10 patches: windows are 4 x 4 patches, so the last row and column are partial
    ((2, 4, 6), (1, 10, 2)),  # a two-frame video (each frame its own segment) and a thin image
]
INPUTS = {  # each kind's graph inputs, in order
    "qwen2_5_vl": ["pixel_values", "patch_positions", "image_ids", "window_rows", "window_slots"],
    "qwen2_vl": ["pixel_values", "patch_positions", "image_ids"],
    "qwen3_vl": ["pixel_values", "patch_positions", "image_ids", "pos_index", "pos_weights"],
}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def built(request, tmp_path_factory):
    """(the model, its spec, the written graph, vision.onnx saved and linted as export.py saves it, and
    vision.ort.onnx beside it, the native form, where our kernel library is built: else None)."""
    import torch
    import transformers

    from trtllm.builder import vision_qwen
    from trtllm.builder.export import save_linted
    from trtllm.builder.vision_export import write_sharing
    from trtllm.plugins import cpu

    out = tmp_path_factory.mktemp(request.param)
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        make_qwen_vl_checkpoint(out / "ckpt", kind=request.param), dtype=torch.float32).eval()
    spec = vision_qwen.spec_of(model.config)
    weights = vision_qwen.weights_of(model)
    graph = vision_qwen.QwenVisionWriter(spec, weights).write()
    save_linted(copy.deepcopy(graph), out, "vision.onnx", "the vision graph", "11.1")  # raises on a lint issue
    native = None
    if cpu.library() is not None:
        write_sharing(vision_qwen.QwenVisionWriter(spec, weights, native=True).write(), out)
        native = out / "vision.ort.onnx"
    return model, spec, graph, out / "vision.onnx", native  # (the checkpoint: out / "ckpt")


@pytest.mark.parametrize("grids", GRIDS, ids=["two_images", "partial_windows", "video+thin"])
def test_vision_graph_matches_transformers(built, grids):
    from trtllm.builder import vision_qwen

    model, spec, _, path, native = built
    report = vision_qwen.verify(path, model, spec, grids=grids, compiled=native)
    assert report["max_abs_error"] <= 1e-4 * max(1.0, report["max_abs_value"])
    if native is None:
        pytest.skip(f"{cpu_missing()} (vision.onnx checked)")
    assert report["compiled_max_abs_error"] <= 1e-4 * max(1.0, report["max_abs_value"])
    assert report["grids"] == [list(g) for g in grids]


def test_graph_inputs_outputs_and_checker(built):
    from trtllm.builder import vision_qwen as vq

    model, spec, graph, _, _ = built
    onnx.checker.check_model(graph)
    assert [i.name for i in graph.graph.input] == INPUTS[spec.model_type]
    shapes = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    if spec.model_type == "qwen3_vl":
        assert shapes[vq.POS_INDEX] == shapes[vq.POS_WEIGHTS] == ["patches", 4]
    assert [o.name for o in graph.graph.output] == [vq.EMBEDS]
    dims = [d.dim_value or d.dim_param for d in graph.graph.output[0].type.tensor_type.shape.dim]
    # the merger's embeddings, then each deepstack merger's (Qwen3-VL: layers 0 and 1), side by side
    deepstack = len(getattr(model.config.vision_config, "deepstack_visual_indexes", ()))
    assert spec.deepstack_layers == deepstack == (2 if spec.model_type == "qwen3_vl" else 0)
    assert dims == ["image_tokens", model.config.text_config.hidden_size * (1 + deepstack)]
    assert spec.patch_dim == 3 * 2 * spec.patch_size ** 2
    assert spec.patch_size == (16 if spec.model_type == "qwen3_vl" else 14)


def test_native_form_inputs_ops_and_shared_weights(built):
    """vision.ort.onnx: window_ids for window_rows and window_slots, one SegmentAttention a layer and no
    ONNX Attention, and no weight of its own (it reads vision.onnx.data)."""
    _, spec, _, path, native = built
    if native is None:
        pytest.skip(cpu_missing())
    model = onnx.load(str(native), load_external_data=False)
    want = [n for n in INPUTS[spec.model_type] if n not in ("window_rows", "window_slots")]
    want += ["window_ids"] if spec.window_size else []
    assert [i.name for i in model.graph.input] == want
    ops = [(n.domain, n.op_type) for n in model.graph.node]
    assert ops.count(("trtllm.cpu", "SegmentAttention")) == spec.depth and ("", "Attention") not in ops
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and {t.external_data[0].value for t in external} == {"vision.onnx.data"}
    assert not (native.parent / "vision.ort.onnx.data").exists()


@pytest.mark.parametrize("form", ["vision.onnx", "vision.ort.onnx"])
@pytest.mark.parametrize("wrong", ["unpermuted_rows", "one_window", "one_image", "reversed_pos_weights",
                                   "unaligned_pos_grid"])
def test_wrong_inputs_are_caught(built, monkeypatch, wrong, form):
    """The deliberately wrong variants: rows left in the processor's order, every row in one window, both
    images in one segment, the position taps' weights reversed, or the learned grid resampled without
    aligned corners (F.interpolate's default, not Qwen3VLVisionModel's) must fail verify (Qwen2-VL and
    Qwen3-VL have no windows, only Qwen3-VL a position grid)."""
    import torch
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    from trtllm.builder import vision_qwen as vq

    model, spec, _, path, native = built
    if form == "vision.ort.onnx" and native is None:
        pytest.skip(cpu_missing())
    if wrong in ("unpermuted_rows", "one_window") and spec.window_size is None:
        pytest.skip(f"{spec.model_type}'s rows are in the processor's order, and it has no windows")
    if wrong.endswith(("pos_weights", "pos_grid")) and spec.num_grid_per_side is None:
        pytest.skip(f"{spec.model_type} has no learned position grid")
    real = vq._inputs

    def broken(grids, s):
        feeds = real(grids, s)
        if wrong == "unpermuted_rows":
            feeds["rows"] = np.arange(len(feeds["rows"]))
        elif wrong == "reversed_pos_weights":
            feeds[vq.POS_WEIGHTS] = np.ascontiguousarray(feeds[vq.POS_WEIGHTS][:, ::-1])
        elif wrong == "unaligned_pos_grid":
            index, weights = get_vision_interpolation_indices_and_weights(
                torch.tensor(grids), s.num_grid_per_side, align_corners=False, spatial_merge_size=s.spatial_merge_size)
            feeds[vq.POS_INDEX], feeds[vq.POS_WEIGHTS] = index.numpy(), weights.numpy()
        else:
            key = vq.WINDOW_IDS if wrong == "one_window" else vq.IMAGE_IDS
            feeds[key] = np.ones_like(feeds[key])
        return feeds

    monkeypatch.setattr(vq, "_inputs", broken)
    with pytest.raises(RuntimeError, match=f"{form}'s image embeddings differ from transformers"):
        if form == "vision.onnx":
            vq.verify(path, model, spec, grids=GRIDS[0])
        else:
            vq.verify(None, model, spec, grids=GRIDS[0], compiled=native)


@pytest.mark.parametrize("kind, field, value", [
    ("qwen2_5_vl", "hidden_act", "relu"),
    ("qwen2_5_vl", "fullatt_block_indexes", []),
    ("qwen2_5_vl", "window_size", 14),
    ("qwen2_5_vl", "patch_size", [14, 14]),
    ("qwen2_vl", "hidden_act", "gelu_fast"),
    ("qwen2_vl", "embed_dim", 36),
    ("qwen3_vl", "hidden_act", "relu"),
    ("qwen3_vl", "hidden_size", 36),
    ("qwen3_vl", "num_position_embeddings", 15),
    ("qwen3_vl", "deepstack_visual_indexes", [1, 0]),
    ("qwen3_vl", "deepstack_visual_indexes", [0, 3]),
    ("qwen3_vl", "patch_size", [16, 16]),
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


def test_section_names_deepstack_and_interleave(built):
    """The manifest section: deepstack_layers K (image_embeds' extra column blocks), mrope_interleaved
    (Qwen3-VL's recomposition always interleaves), num_grid_per_side (the runtime's pos_index needs it)
    and Qwen3-VL's processor (16 px patches, size's shortest_edge / longest_edge)."""
    import transformers

    from trtllm.builder import vision_qwen as vq

    model, spec, _, path, _ = built
    qwen3 = spec.model_type == "qwen3_vl"
    ckpt = path.parent / "ckpt"
    out = vq.section(model, transformers.AutoTokenizer.from_pretrained(ckpt), spec, ckpt)
    assert out["architecture"] == spec.model_type and out["hidden_size"] == 64
    assert out["deepstack_layers"] == (2 if qwen3 else 0)
    assert out["mrope_interleaved"] is qwen3
    assert out["mrope_section"] == ([3, 3, 2] if qwen3 else [2, 3, 3])
    assert out["num_grid_per_side"] == (4 if qwen3 else None) and out["window_size"] == spec.window_size
    assert out["image_token"] == "<|image_pad|>"
    pre = out["preprocess"]
    assert (pre["patch_size"], pre["merge_size"]) == (spec.patch_size, 2)
    if qwen3:
        assert (pre["min_pixels"], pre["max_pixels"], pre["image_mean"]) == (64 * 64, 32 * 32 * 64, [0.5] * 3)
