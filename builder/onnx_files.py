"""The engine's ONNX files: a graph saved with its data file beside it (and the TensorRT op lint of
it), and ONNX Runtime's offline-optimised form compiled from it."""
from __future__ import annotations

import os
from pathlib import Path

import onnx

from trtllm.builder.quantize import QuantScheme
from trtllm.plugins import cpu as cpu_kernels
from trtllm.plugins import lint
from trtllm.plugins.sample import body as sample_body

ONNX_NAME, ORT_NAME, ORT_SOURCE = "llm.onnx", "llm.ort.onnx", "llm.ort-source.onnx"


def save_linted(model: onnx.ModelProto, out_dir: Path, name: str, what: str, trt_version: str) -> None:
    """save(), then the TensorRT op lint of the graph as saved, without its weights: shape inference
    on the model in memory serialised every weight again (3.2-3.6x the weights' bytes: the build's
    peak), and past 2 GiB could not at all."""
    save(model, out_dir, name)
    del model  # (the caller's was a temporary: its weights go before the lint)
    issues = lint.lint_model(out_dir / name, trt_version)
    if issues:
        raise RuntimeError(f"{what} fails the TensorRT {trt_version} op lint:\n" +
                           "\n".join(f"  {i.node} ({i.op}): {i.message}" for i in issues))


def save(model: onnx.ModelProto, out_dir: Path, name: str) -> None:
    """`name` may be in a subdirectory (eagle/draft.onnx); its data file sits next to it, where a
    writer that stored its weights as it made them (GraphWriter.store_in) left them."""
    path = out_dir / name
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):  # (stored)
        onnx.save_model(model, path)  # (the small tensors stay in the graph, as below)
        return
    cwd = os.getcwd()
    os.chdir(path.parent)  # onnx refuses a data file name that exists in the *current* directory
    try:
        onnx.save_model(model, path.name, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    finally:
        os.chdir(cwd)


def compile_onnxruntime(out_dir: Path, log, quant: QuantScheme | None = None, native: bool = False,
                        names: tuple[str, str, str] = (ONNX_NAME, ORT_SOURCE, ORT_NAME)) -> None:
    """Save ONNX Runtime's offline-optimised graph, so loading the engine skips those passes; made
    from the lowered source graph when there is one (deleted after), else the canonical one.
    `names`: (canonical, lowered source, compiled) files."""
    import onnxruntime as ort

    onnx_name, source_name, compiled_name = names
    log(f"compiling {compiled_name} for ONNX Runtime")
    opts = ort.SessionOptions()
    # EXTENDED, not ALL: level-ALL fusions are tied to this CPU's instruction set.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(out_dir / compiled_name)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                  Path(compiled_name).name + ".data")
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    # (this session only writes the graph: its MatMuls' packed copies of the weights would be memory for nothing)
    opts.add_session_config_entry("session.disable_prepacking", "1")
    if quant is not None:  # DequantizeLinear + MatMul -> MatMulNBits with int8 activations
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", str(quant.ort_accuracy_level))
    if native:
        opts.register_custom_ops_library(str(cpu_kernels.library()))
    opts.log_severity_level = 3
    source = out_dir / source_name if (out_dir / source_name).is_file() else out_dir / onnx_name
    patched = None
    if source.name == Path(onnx_name).name:  # the canonical graph: its sampler's draw in float64 for ONNX Runtime
        model = onnx.load(str(source), load_external_data=False)
        if sample_body.with_float64_draw(model):  # (its weights stay in the canonical graph's data file)
            patched = source.with_name(f".{source.name}.float64-draw")
            onnx.save(model, str(patched))
    try:
        ort.InferenceSession(str(patched or source), opts, providers=["CPUExecutionProvider"])
    finally:
        if patched is not None:
            patched.unlink()
    if source.name == Path(source_name).name:
        source.unlink()
        source.with_name(source.name + ".data").unlink()
