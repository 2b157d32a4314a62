"""TensorRT backend (NVIDIA GPUs and Jetson). `tensorrt` is imported only when an engine asks for it.

Not implemented yet: an engine whose manifest names this backend is refused with one clear line.
"""
from __future__ import annotations

from trtllm.runtime.manifest import Manifest, ManifestError, rebuild_hint


class TensorRTEngine:
    def __init__(self, engine_dir, manifest: Manifest, **options):
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            raise ManifestError(f"{engine_dir} was built for TensorRT, which is not installed here; "
                                f"install TensorRT or {rebuild_hint(engine_dir)} --backend onnxruntime") from None
        raise ManifestError(f"{engine_dir}: the TensorRT runtime is not implemented in this version; "
                            f"{rebuild_hint(engine_dir)} --backend onnxruntime")
