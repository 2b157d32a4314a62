"""What a model's engine cannot be built with yet, by what its layers hold (a mixture of experts, short
convolutions, projection widths that do not split into quantization blocks), each refused with the option
and the reason named before anything is written; and where a mixture of experts' experts take LoRA."""
from __future__ import annotations

from trtllm.builder.config import BuildConfig, ConfigError
from trtllm.builder.decoder_spec import projection_widths
from trtllm.builder.quantize import QuantScheme
from trtllm.plugins import cpu as cpu_kernels


def refuse_for_experts(config: BuildConfig, spec, backend: str, native_experts: bool) -> None:
    """What a mixture-of-experts model cannot be built with yet: quantized experts for TensorRT, int8
    ones or 16-bit engines' int4 ones without our kernel (ONNX Runtime's QMoE rounds 8-bit activations
    too, and holds float32 scales). (LoRA adapts its attention, dense layers, shared expert and routed
    experts, router: decoder.lora_sites.)"""
    what = f"{spec.architecture} is a mixture of experts ({spec.moe.num_experts} experts, {spec.moe.top_k} a token)"
    q = config.quantization
    if q != "none" and backend == "tensorrt":
        raise ConfigError(f"--quantization {q} --backend tensorrt: {what}; quantized experts are built for ONNX "
                          "Runtime only for now (their graph for TensorRT has not run on it); build it unquantized")
    if q != "none" and not native_experts:
        why = ("--cpu-kernels onnxruntime asks for ONNX Runtime's own" if config.cpu_kernels == "onnxruntime" else
               cpu_kernels.missing_hint() if cpu_kernels.library() is None else
               f"they need a hidden size and expert width that are multiples of 32 (this model's: "
               f"{spec.hidden_size}, {spec.moe.expert_size})")
        if q == "int8":
            raise ConfigError(f"--quantization int8: {what}, whose int8 experts run on our CPU kernels only (ONNX "
                              f"Runtime's 8-bit QMoE rounds the activations to 8 bits too), and {why}; use "
                              "--quantization int4, or build it unquantized")
        if config.dtype != "float32":
            raise ConfigError(f"--quantization {q} --dtype {config.dtype}: {what}, whose int4 experts run on ONNX "
                              f"Runtime's QMoE without our CPU kernels ({why}), with --dtype float32 only")


def refuse_for_mamba(config: BuildConfig, spec, backend: str) -> None:
    """What a model with Mamba-2 layers (builder/mamba.py) cannot be built with yet: TensorRT (its engine
    binds no state buffers yet), an EAGLE head (speculative decoding rolls back by position; a recurrent
    state cannot be)."""
    what = f"{spec.architecture} has Mamba-2 layers ({len(spec.mamba_layers)} of {spec.num_layers})"
    if backend == "tensorrt":
        raise ConfigError(f"--backend tensorrt: {what}, whose recurrent state the TensorRT engine does not bind yet; "
                          "use --backend onnxruntime")
    if config.eagle:
        raise ConfigError(f"--eagle: {what}, whose recurrent state cannot be rolled back to a draft's accepted "
                          "tokens; build without it")


def refuse_for_convolutions(config: BuildConfig, spec) -> None:
    """What a model with short-convolution layers (LFM2: builder/short_conv.py) cannot be built with yet:
    an int8 KV cache (our attention kernel's rows; the convolutions keep theirs in standard ops). (EAGLE
    heads draft chains there, not trees: a tree's tokens do not follow their parents, which a
    convolution reads.)"""
    if config.kv_cache_dtype == "int8":
        raise ConfigError(f"--kv-cache-dtype int8: {spec.architecture} has short-convolution layers "
                          f"({len(spec.conv_layers)} of {spec.num_layers}), which it does not take yet; build without it")



def lora_on_experts(spec, ort_moe_node: bool) -> bool:
    """Whether a mixture of experts' routed experts get LoRA inputs: where our MoE kernel or standard
    ops run them, not where ONNX Runtime's MoE / QMoE node does (`ort_moe_node`: it takes no deltas)."""
    return spec.moe is not None and not ort_moe_node


def check_blocks(spec, quant: QuantScheme, what: str) -> None:
    """Each quantized MatMul's input features must split into whole blocks: hidden_size (q/k/v,
    gate/up, lm_head), heads x head_dim (o_proj) and intermediate_size (down_proj), as
    decoder_spec.projection_widths gives them, and the experts' (down_proj) of a mixture of experts."""
    sizes = projection_widths(spec)
    if spec.moe is not None:
        sizes["the experts' intermediate size"] = spec.moe.expert_size
    bad = [f"{name} {n}" for name, n in sizes.items() if n % quant.block_size]
    if bad:
        raise ConfigError(f"--quantization int{quant.bits}: {what} has {', '.join(bad)}, not a "
                          f"multiple of the quantization block ({quant.block_size}); build it unquantized")
