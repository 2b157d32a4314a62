"""What runs where on ONNX Runtime, decided before a graph is written: our CPU kernels (plugins/cpu)
or ONNX Runtime's own, and what neither can run, refused naming what stands in the way."""
from __future__ import annotations

from trtllm.builder.config import BuildConfig, ConfigError
from trtllm.builder.decoder_spec import projection_widths
from trtllm.builder.quantize import QuantScheme
from trtllm.plugins import cpu as cpu_kernels


def ort_activations(config: BuildConfig, quant: QuantScheme | None) -> str:
    """The activations' dtype of the ONNX Runtime form: quantized weights run with float32
    activations there, whatever the KV cache's dtype; else --dtype's."""
    return "float32" if quant is not None else config.dtype


def refuse_bfloat16(config: BuildConfig, backend: str, runs: bool, spec, what: str = "this model") -> None:
    """A bfloat16 graph on ONNX Runtime must run on our kernels (`runs`: it does), as ONNX Runtime has
    no bfloat16 CPU kernels; else the build stops, saying what stands in the way."""
    if backend != "onnxruntime" or config.dtype != "bfloat16" or runs:
        return
    if config.graph == "legacy" or config.cpu_kernels == "onnxruntime":
        why = (f"they take the modern graph with --cpu-kernels auto|native, got --graph {config.graph} "
               f"--cpu-kernels {config.cpu_kernels}")
    elif cpu_kernels.library() is None:
        why = cpu_kernels.missing_hint()
    else:
        why = half_obstacle(spec, what)
    raise ConfigError(f"--dtype bfloat16 on ONNX Runtime runs on our CPU kernels (ONNX Runtime has no bfloat16 "
                      f"CPU kernels), and {why}; use --dtype float16")


def half_obstacle(spec, what: str = "this model") -> str:
    """Why a 16-bit model's form cannot run on our kernels (decoder_spec.half_supported), named."""
    if spec.head_dim % 16:
        return f"{what} cannot run on them: its head size ({spec.head_dim}) is not a multiple of 16"
    for name, width in projection_widths(spec).items():
        if width % 32:
            return f"{what} cannot run on them: its {name} ({width}), a projection's input width, is not a multiple of 32"
    return f"{what} cannot run on them: its attention is not one they run"


def use_native_kernels(config: BuildConfig, runs_here: bool, log) -> bool:
    """--cpu-kernels: native needs the built library and something to run on it (attention where
    GroupQueryAttention would go, a float16 model, quantized MatMuls: `runs_here` or quantization);
    auto takes it when it is there, and says so."""
    if config.cpu_kernels == "onnxruntime" or not (runs_here or config.quantization != "none"):
        if config.cpu_kernels == "native":
            raise ConfigError("--cpu-kernels native: this model has nothing the native kernels run (they need "
                               "--quantization int8/int4, or a head size that is a multiple of 16)")
        return False
    if cpu_kernels.library() is None:
        if config.cpu_kernels == "native":
            raise ConfigError(f"--cpu-kernels native: {cpu_kernels.missing_hint()}")
        log(f"cpu kernels: ONNX Runtime's own, GroupQueryAttention and MatMulNBits ({cpu_kernels.missing_hint()})")
        return False
    return True
