"""BuildConfig: everything that decides what `trtllm-build` writes. One typed object, no string options."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

BACKENDS = ("auto", "onnxruntime", "tensorrt")
DTYPES = ("float32", "float16", "bfloat16")
QUANTIZATIONS = ("none", "int8", "int4")


class ConfigError(ValueError):
    """A build option is invalid or not supported yet."""


def profile_defaults(name: str = "cpu-default") -> dict:
    """Limits and options of a build profile shipped in configs/."""
    text = resources.files("trtllm.configs").joinpath(f"{name}.json").read_text()
    return json.loads(text)


@dataclass(frozen=True)
class BuildConfig:
    model: str
    output: str
    backend: str = "auto"
    dtype: str = "float32"
    quantization: str = "none"
    max_batch_size: int = 8
    max_input_len: int = 2048
    max_kv_cache_capacity: int = 4096
    lora: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    eagle: str | None = None
    verify: bool = True

    def __post_init__(self):
        for name, allowed in (("backend", BACKENDS), ("dtype", DTYPES), ("quantization", QUANTIZATIONS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"--{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("max_batch_size", "max_input_len", "max_kv_cache_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.max_input_len > self.max_kv_cache_capacity:
            raise ConfigError(f"--max-input-len must be <= --max-kv-cache-capacity "
                              f"({self.max_kv_cache_capacity}), got {self.max_input_len}")
        self.refuse_unimplemented()

    def refuse_unimplemented(self) -> None:
        """Options from the CLI contract that this version cannot honour fail loudly, never silently."""
        if self.dtype == "bfloat16":
            raise ConfigError("--dtype bfloat16 needs the TensorRT backend: ONNX Runtime's CPU kernels have no "
                              "bfloat16 MatMul; use --dtype float16 or float32")
        if self.quantization != "none" and self.dtype != "float32":
            raise ConfigError(f"--quantization {self.quantization} needs --dtype float32 (the activations' "
                              f"type), got {self.dtype}")
        if self.lora:
            raise ConfigError("--lora is not supported yet: LoRA adapters cannot be built into an engine so far")
        if self.eagle:
            raise ConfigError("--eagle is not supported yet: EAGLE draft heads cannot be built so far")
        if self.backend == "tensorrt":
            raise ConfigError("--backend tensorrt is not supported yet: build for onnxruntime "
                              "(or auto) until the TensorRT backend lands")

    def to_json(self) -> dict:
        return {k: (list(map(list, v)) if k == "lora" else v) for k, v in self.__dict__.items()}
