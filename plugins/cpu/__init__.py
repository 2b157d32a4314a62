"""trtllm.cpu: native ONNX Runtime CPU kernels (a C++ custom-op library), used by ONNX Runtime engines.

`library()` is the built shared library or None; `scripts/setup.sh` builds it with
`python -m trtllm.plugins.cpu.build`. Nothing here imports onnxruntime or onnx: the runtime and
the builder each register the library with their own session options.
"""
from __future__ import annotations

from pathlib import Path

DOMAIN = "trtllm.cpu"
OP = "MatMulBlockQuant"
ATTENTION = "Attention"
HALF = "MatMulHalf"  # float16 weights, float32 activations (a float16 engine's projections)
LORA = "LoraAdd"     # a fused projection plus its LoRA deltas (LoRA engines)
LORA_SWIGLU = "LoraAddSwiglu"  # the same, then silu(gate) * up (gate|up)
SAMPLE = "Sample"  # trtllm::Sample (plugins/sample) in C++: the sampler of the engines on our kernels
MOE = "MoE"        # a mixture of experts' MLP, the chosen experts only (float32, float16 or bfloat16 experts)
MOE_QUANT = "MoEBlockQuant"  # the same for int4 or int8 experts, packed as MatMulBlockQuant's weights
MAMBA = "MambaScan"  # a Mamba-2 layer's convolution and selective scan, its states in place (builder/mamba.py)
LOWERING = f"{DOMAIN}::{OP}"  # how an engine's manifest (`lowerings`) says it needs this library
ATTENTION_LOWERING = f"{DOMAIN}::{ATTENTION}"
SEGMENT_ATTENTION_LOWERING = f"{DOMAIN}::SegmentAttention"  # a vision encoder's (vision.ort.onnx)
HALF_LOWERING = f"{DOMAIN}::{HALF}"
LORA_LOWERING = f"{DOMAIN}::{LORA}"
SAMPLE_LOWERING = f"{DOMAIN}::{SAMPLE}"
MOE_LOWERING = f"{DOMAIN}::{MOE}"
MOE_QUANT_LOWERING = f"{DOMAIN}::{MOE_QUANT}"
MAMBA_LOWERING = f"{DOMAIN}::{MAMBA}"
LAYOUT = 1         # the weight packing the kernel reads (its `layout` attribute; kLayout in the .cc)
SWIGLU_GROUP = 16  # activation=swiglu: outputs per 32-row task (kChunkRows / 2 in the .cc)
LIBRARY = Path(__file__).with_name("libtrtllm_cpu.so")


def needed_by(lowerings) -> bool:
    """Whether an engine with these manifest `lowerings` runs kernels of this library."""
    return any(name.startswith(DOMAIN + "::") for name in lowerings)


def library() -> Path | None:
    """The built library, or None when `python -m trtllm.plugins.cpu.build` has not run here, or not
    since the sources changed: ONNX Runtime ignores attributes an op does not know, so an old library
    would run an engine with, say, `activations` int8 in float32 without a word."""
    return LIBRARY if LIBRARY.is_file() and not stale() else None


def stale() -> bool:
    """Whether the library was built from other sources than these, or is not the file that build
    wrote (build.py's SHA-256 stamp)."""
    from trtllm.plugins.cpu import build  # stdlib only; imported here, when a library is there

    try:
        return build.needs_build(compiler=False)
    except OSError:  # the sources are not shipped beside the library: nothing to compare with
        return False


def set_huge_pages(on: bool) -> None:
    """Whether the kernels copy their weights onto huge pages (trtllm-run --huge-pages/--no-huge-pages;
    the library is the one ONNX Runtime loads: the same path is the same library in a process)."""
    import ctypes

    if LIBRARY.is_file():  # whether it is current is the loader's question (library()), asked before this
        ctypes.CDLL(str(LIBRARY)).trtllm_cpu_set_huge_pages(1 if on else 0)


def segment_attention_fast() -> bool:
    """Whether trtllm.cpu::SegmentAttention takes its AVX2 path on this CPU (not where TRTLLM_CPU_KERNEL=generic
    asks for the portable one): where it does not, ONNX Runtime's own Attention is faster, and the
    runtime runs a Qwen-VL engine's vision.onnx instead of vision.ort.onnx (runtime/media.py)."""
    import ctypes

    return library() is not None and ctypes.CDLL(str(LIBRARY)).trtllm_cpu_avx2() == 1


def copied_bytes() -> int:
    """The bytes of weights the kernels have copied onto huge pages in this process (constant
    initializers only: a weight fed as a graph input is read where it is, every call)."""
    import ctypes

    fn = ctypes.CDLL(str(LIBRARY)).trtllm_cpu_copied_bytes
    fn.restype = ctypes.c_uint64
    return int(fn())


def row_sampler():
    """trtllm_cpu_sample_row: one row drawn as the engine's trtllm.cpu::Sample draws it (the same
    code: the same token for the same inputs and uniform), or None without the library. Arguments:
    logits, logit_bias, penalty_bias (float32 [V] pointers), seen (bool [V]), repetition_penalty,
    temperature, min_p, top_k, top_p, uniform, vocabulary size, max_top_k; returns the token (-1:
    the logits overflowed, or every token is banned; -2: sizes that disagree, nothing read)."""
    import ctypes

    global _row_sampler
    if _row_sampler is None and library() is not None:
        f = ctypes.CDLL(str(LIBRARY)).trtllm_cpu_sample_row
        f.restype = ctypes.c_int64
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_float] * 3 + [ctypes.c_int64, ctypes.c_float, ctypes.c_float,
                                                                     ctypes.c_int64, ctypes.c_int64]
        _row_sampler = f
    return _row_sampler


_row_sampler = None


def fingerprint() -> str:
    """The loaded library and the code path it takes on this CPU: results differ in their low bits
    between paths (4 AVX-512 with VNNI, 3 AVX-512, 2 AVX2, 1 portable) and between builds."""
    import ctypes
    import hashlib

    level = ctypes.CDLL(str(LIBRARY)).trtllm_cpu_kernel_path()
    return f"trtllm.cpu {hashlib.sha256(LIBRARY.read_bytes()).hexdigest()[:16]} path {level}"


def compiler_name() -> str:
    """The C++ compiler the library is built with: $CXX, else g++."""
    import os

    return os.environ.get("CXX", "g++")


def missing_hint() -> str:
    import shutil

    state = ("was built from other sources than these, or is damaged" if LIBRARY.is_file() else "is not built")
    cxx = compiler_name()
    need = "" if shutil.which(cxx) else f"; it needs a C++ compiler, and {cxx} is not on PATH (apt-get install g++)"
    return (f"the native CPU kernel library {LIBRARY} {state}: run `bash scripts/setup.sh` "
            f"(or `python -m trtllm.plugins.cpu.build`){need}")
