"""The manifest's vision section (builder/vision.py, builder/vision_qwen.py), checked at load: the
runtime places a request's image tokens and makes its pixels by these numbers, so a damaged one is
refused by name here rather than giving wrong answers later. Standard library only, as manifest.py."""
from __future__ import annotations

from trtllm.plugins.cpu import SEGMENT_ATTENTION_LOWERING as SEGMENT_ATTENTION

KEYS = ("architecture", "graph", "hidden_size", "image_token", "image_token_id", "start_token_id",
        "end_token_id", "preprocess")
# each encoder's own keys, and its preprocess section's (runtime/images.py, runtime/images_qwen.py)
QWEN = (("mrope_section", "mrope_interleaved", "window_size", "deepstack_layers", "num_grid_per_side"),
        ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels", "resample",
         "rescale_factor", "image_mean", "image_std"))
TILES = ("size", "crop_to_patches", "min_patches", "max_patches", "resample", "rescale_factor", "image_mean",
         "image_std")  # (runtime/images.py)
KINDS = {
    "internvl": (("image_size", "tokens_per_tile"), TILES),
    # Gemma 3: one tile an image (and with pan-and-scan its crops: runtime/images_gemma3.py); the text of
    # its start and end tokens, which the prompt's text takes (media.expanded_text), and its image tokens
    # seen both ways (the graph's image_ahead)
    "gemma3": (("image_size", "tokens_per_tile", "start_token", "end_token", "bidirectional"), (*TILES, "pan_and_scan")),
    "qwen2_5_vl": QWEN,
    "qwen2_vl": QWEN,  # (its window_size null: no windowed layers)
    "qwen3_vl": QWEN,  # (no windows either; deepstack_layers of its language model take extra image rows)
    # Idefics3 and SmolVLM: the ids of each piece of an image's prompt text (runtime/images_idefics3.py)
    "idefics3": (("image_size", "tokens_per_tile", "global_ids", "row_col_ids", "newline_ids", "break_ids"),
                 ("longest_edge", "tile", "splitting", "resample", "rescale_factor", "image_mean", "image_std")),
    # Gemma 4: each image its own patches, up to max_patches (runtime/images_gemma4.py); its tokens seen
    # both ways on the sliding layers where bidirectional
    "gemma4": (("bidirectional", "max_patches"),
               ("patch_size", "pooling_kernel_size", "max_soft_tokens", "resample", "rescale_factor", "image_mean",
                "image_std")),
}


def check(m) -> str:
    """A Manifest's vision section, or "" where it is sound (or absent)."""
    from trtllm.runtime.manifest import whole

    v = m.vision
    if not v:
        return ""
    kind = KINDS.get(v.get("architecture"))
    if kind is None:
        return f"vision.architecture must be one of {sorted(KINDS)}, got {v.get('architecture')!r}"
    missing = [k for k in KEYS + kind[0] if k not in v]
    if missing:
        return f"vision lacks {', '.join(missing)}"
    if v["graph"] != m.files.get("vision"):
        return f"vision.graph {v['graph']!r} must be files.vision {m.files.get('vision')!r}"
    # its ONNX Runtime form on our kernels (Qwen-VL's, Gemma 3's and 4's: vision.ort.onnx), where the build wrote one
    compiled = v.get("compiled")
    if compiled != m.files.get("vision_compiled") or (compiled is not None and (
            kind is not QWEN and v["architecture"] not in ("gemma3", "gemma4")
            or v.get("lowerings") != [SEGMENT_ATTENTION])):
        return (f"vision.compiled {compiled!r} must be files.vision_compiled {m.files.get('vision_compiled')!r}, on "
                f"a Qwen-VL or Gemma engine, with lowerings [{SEGMENT_ATTENTION!r}], got {v.get('lowerings')!r}")
    for name in ("image_token_id", "start_token_id", "end_token_id"):
        if not (whole(v[name], 0) and v[name] < m.model.vocab_size):
            return f"vision.{name} must be a token id below the vocabulary size {m.model.vocab_size}, got {v[name]!r}"
    if v["hidden_size"] != m.model.hidden_size:
        return f"vision.hidden_size must be model.hidden_size ({m.model.hidden_size}), got {v['hidden_size']!r}"
    if not isinstance(v["image_token"], str):
        return f"vision.image_token must be a string, got {v['image_token']!r}"
    if m.backend != "onnxruntime" and not m.files.get("vision_plan"):  # (TensorRT engines: vision.onnx's plan)
        return f"a vision section on a {m.backend!r} engine needs files.vision_plan, got {m.files.get('vision_plan')!r}"
    pre = v["preprocess"]
    if not isinstance(pre, dict) or set(pre) != set(kind[1]):
        return f"vision.preprocess must hold {', '.join(kind[1])}, got {pre!r:.200}"
    numbers = all(isinstance(pre[k], list) and len(pre[k]) == 3 and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in pre[k]) for k in ("image_mean", "image_std"))
    if not numbers or 0 in pre["image_std"] or not whole(pre["resample"], 0) or pre["resample"] > 5:
        return (f"vision.preprocess's image_mean and image_std must be 3 numbers each (no std 0), and resample a "
                f"PIL filter number 0..5, got {pre!r:.200}")
    if v["architecture"] == "gemma4":
        return gemma4(v, pre)
    if v.get("bidirectional", False) is not (v["architecture"] == "gemma3"):
        return f"vision.bidirectional must be true on gemma3 and absent elsewhere, got {v.get('bidirectional')!r}"
    if v["architecture"] == "idefics3":
        return idefics3(v, pre, m.model.vocab_size)
    if v["architecture"] == "gemma3" and not (
            pre["crop_to_patches"] is False and all(isinstance(v[k], str) and v[k] for k in ("start_token", "end_token"))):
        return (f"vision.start_token and end_token must be the text of those tokens and preprocess.crop_to_patches "
                f"false on gemma3, got {v['start_token']!r}, {v['end_token']!r}, {pre['crop_to_patches']!r}")
    pas = pre.get("pan_and_scan")
    if v["architecture"] == "gemma3" and pas is not None and not (
            isinstance(pas, dict) and set(pas) == {"min_crop_size", "max_num_crops", "min_ratio_to_activate"}
            and whole(pas["min_crop_size"]) and whole(pas["max_num_crops"])
            and isinstance(pas["min_ratio_to_activate"], (int, float)) and pas["min_ratio_to_activate"] >= 1):
        return (f"vision.preprocess.pan_and_scan must be null or hold min_crop_size and max_num_crops (integers >= 1) "
                f"and min_ratio_to_activate (>= 1), got {pas!r}")
    if v["architecture"] in ("internvl", "gemma3"):
        if not whole(v["tokens_per_tile"]) or pre["size"] != v["image_size"] \
                or not all(whole(pre[k]) for k in ("min_patches", "max_patches")):
            return (f"vision.tokens_per_tile and preprocess.min_patches and max_patches must be integers >= 1 and "
                    f"preprocess.size vision.image_size, got {v['tokens_per_tile']!r}, {pre!r:.200}")
        return ""
    section, qwen3 = v["mrope_section"], v["architecture"] == "qwen3_vl"
    if not (isinstance(section, list) and len(section) == 3 and all(whole(n) for n in section)
            and sum(section) * 2 == m.model.head_dim):
        return f"vision.mrope_section must be 3 integers >= 1 adding up to head_dim / 2, got {section!r}"
    if v["mrope_interleaved"] is not qwen3:  # (the graph's choice, which the runtime does not make)
        return f"vision.mrope_interleaved must be {str(qwen3).lower()} on {v['architecture']}, got {v['mrope_interleaved']!r}"
    most = m.model.num_layers if qwen3 else 0  # (the layers the vision graph's extra rows go to: Qwen3-VL's)
    if not (whole(v["deepstack_layers"], 0) and v["deepstack_layers"] <= most):
        return f"vision.deepstack_layers must be an integer in [0, {most}] on {v['architecture']}, got {v['deepstack_layers']!r}"
    if not all(whole(pre[k]) for k in ("patch_size", "temporal_patch_size", "merge_size", "min_pixels", "max_pixels")) \
            or pre["min_pixels"] > pre["max_pixels"]:
        return f"vision.preprocess's sizes must be integers >= 1 (min_pixels <= max_pixels), got {pre!r:.200}"
    # Qwen2-VL has no windowed layers; Qwen2.5-VL's windows hold a merged patch at least
    least = pre["merge_size"] * pre["patch_size"]
    grid = v["num_grid_per_side"]  # (Qwen3-VL's learned position grid, resampled to each image's)
    if (grid is None) != (v["architecture"] != "qwen3_vl") or not (grid is None or whole(grid)):
        return (f"vision.num_grid_per_side must be an integer >= 1 on qwen3_vl and null on the others, got "
                f"{grid!r}")
    windowless = v["architecture"] != "qwen2_5_vl"
    if (v["window_size"] is not None) if windowless else not whole(v["window_size"], least):
        return ("vision.window_size must be " + (f"null on {v['architecture']}" if windowless else
                f"an integer >= merge_size x patch_size ({least})") + f", got {v['window_size']!r}")
    return ""


def gemma4(v: dict, pre: dict) -> str:
    from trtllm.runtime.images_gemma4 import SOFT_TOKENS
    from trtllm.runtime.manifest import whole

    if not isinstance(v["bidirectional"], bool):
        return f"vision.bidirectional must be true or false on gemma4, got {v['bidirectional']!r}"
    if not (whole(pre["patch_size"]) and whole(pre["pooling_kernel_size"]) and pre["max_soft_tokens"] in SOFT_TOKENS
            and v["max_patches"] == pre["max_soft_tokens"] * pre["pooling_kernel_size"] ** 2):
        return (f"vision.preprocess.patch_size and pooling_kernel_size must be integers >= 1, max_soft_tokens one of "
                f"{list(SOFT_TOKENS)} and vision.max_patches max_soft_tokens x pooling_kernel_size^2, got "
                f"{v['max_patches']!r}, {pre!r:.200}")
    return ""


def idefics3(v: dict, pre: dict, vocab: int) -> str:
    from trtllm.runtime.images_idefics3 import largest_side
    from trtllm.runtime.manifest import whole

    def ids(x) -> bool:
        return isinstance(x, list) and all(whole(t, 0) and t < vocab for t in x)

    if not (whole(v["tokens_per_tile"]) and all(whole(pre[k]) for k in ("longest_edge", "tile"))
            and isinstance(pre["splitting"], bool) and v["image_size"] == [pre["tile"]] * 2):
        return (f"vision.tokens_per_tile and preprocess.longest_edge and tile must be integers >= 1, preprocess.splitting "
                f"true or false and vision.image_size [tile, tile], got {v['tokens_per_tile']!r}, {pre!r:.200}")
    side = largest_side(pre)
    grid = v["row_col_ids"]
    if not all(ids(v[k]) and v[k] for k in ("global_ids", "newline_ids", "break_ids")) or not (
            isinstance(grid, list) and len(grid) >= side and all(
                isinstance(row, list) and len(row) >= side and all(ids(t) and t for t in row) for row in grid)):
        return (f"vision.global_ids, newline_ids, break_ids and row_col_ids ({side} x {side} at least) must hold "
                f"token ids below the vocabulary size {vocab}")
    return ""
