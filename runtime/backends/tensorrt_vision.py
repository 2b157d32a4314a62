"""TensorRT backend: a vision-language engine's image encoder plan (vision.plan), beside llm.plan
(runtime/backends/tensorrt.py). `tensorrt` and `cuda` are imported only when one is loaded."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trtllm.runtime.backends.tensorrt import deserialize, held_dtype, import_tensorrt, trt_rebuild_hint
from trtllm.runtime.manifest import Manifest, ManifestError


class TensorRTVision:
    """A vision-language engine's image encoder plan (vision.plan, builder/tensorrt.py vision_profiles):
    an image's feeds (runtime/media.py ImageEncoder.encode's) -> its tokens' embeddings [tokens, hidden
    (Qwen3-VL: x (1 + its DeepStack layers))]. InternVL's and Idefics3's tiles run a profile's most at a
    time; Qwen's patches run whole, with their index inputs, as do Gemma 4's with their positions. Loaded at an engine's first image, beside
    llm.plan (whose load checked the TensorRT version and GPU both plans were built for)."""

    def __init__(self, engine_dir, manifest: Manifest):
        trt = import_tensorrt(engine_dir)
        from trtllm.runtime.backends import cuda

        path = Path(engine_dir) / manifest.files["vision_plan"]
        if not path.is_file():
            raise ManifestError(f"{path} is missing; {trt_rebuild_hint(engine_dir)}")
        self.runtime, self.engine, self.context = deserialize(trt, path, engine_dir)
        self.stream = cuda.Stream()
        v = manifest.vision
        self.width = v["hidden_size"] * (1 + v.get("deepstack_layers", 0))
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.dtypes = {n: held_dtype(trt, self.engine.get_tensor_dtype(n)) for n in self.inputs}
        most = {n: tuple(self.engine.get_tensor_profile_shape(n, 0)[2]) for n in self.inputs}
        # (Qwen's: one run of patches, M x M a token; Gemma 4's: one of patches, k x k a token)
        patch_unit = v["preprocess"].get("merge_size", v["preprocess"].get("pooling_kernel_size"))
        self.tiled = patch_unit is None
        self.per = v["tokens_per_tile"] if self.tiled else patch_unit ** 2
        self.most = most["pixel_values"][0]  # tiles, or patches
        rows = self.most * self.per if self.tiled else self.most // self.per
        self.buffers = {n: cuda.DeviceBuffer(int(np.prod(most[n])) * self.dtypes[n].itemsize) for n in self.inputs}
        self.buffers["image_embeds"] = cuda.DeviceBuffer(rows * self.width * 4)

    def __call__(self, feeds: dict) -> np.ndarray:
        if not self.tiled:
            return self.run(feeds, len(feeds["pixel_values"]) // self.per)
        pixels = feeds["pixel_values"]
        return np.concatenate([self.run({"pixel_values": pixels[i:i + self.most]}, len(pixels[i:i + self.most]) * self.per)
                               for i in range(0, len(pixels), self.most)])

    def run(self, feeds: dict, rows: int) -> np.ndarray:
        alive = []
        for name in self.inputs:
            array = np.ascontiguousarray(feeds[name], self.dtypes[name])
            alive.append(array)
            if not self.context.set_input_shape(name, array.shape):
                lo, _, hi = self.engine.get_tensor_profile_shape(name, 0)
                raise RuntimeError(f"TensorRT rejected {name} of shape {array.shape} (vision.plan's profile: "
                                   f"{tuple(lo)} to {tuple(hi)}): the engine's image limits are in manifest.json")
            if array.size:
                self.stream.upload(self.buffers[name].ptr, array)
        for name, buffer in self.buffers.items():
            if not self.context.set_tensor_address(name, buffer.ptr):
                raise RuntimeError(f"TensorRT rejected the address of {name}: vision.plan has no such tensor")
        if not self.context.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT failed to enqueue the vision encoder (see its log)")
        embeds = np.empty((rows, self.width), np.float32)
        self.stream.download(embeds, self.buffers["image_embeds"].ptr)
        self.stream.sync()
        return embeds

    def close(self) -> None:
        if getattr(self, "stream", None) is None:
            return
        self.stream.sync()
        for buffer in self.buffers.values():
            buffer.close()
        self.context = self.engine = None
        self.stream.close()
        self.stream = None
