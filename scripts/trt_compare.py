"""Compare an engine's compiled form with its canonical llm.onnx run by ONNX Runtime, through Polygraphy.

    python scripts/trt_compare.py ENGINE_DIR [--atol 0.05] [--rtol 0.01] [--json OUT.json]

The compiled form is llm.plan on a TensorRT engine (Polygraphy's TrtRunner, one runner per
optimization profile) or llm.ort.onnx on an ONNX Runtime engine (the ORT lowerings). Two steps
are compared from the same inputs: a prefill of two prompts of different lengths (profile 0) and
one decode step from the reference's KV (profile 1). The greedy row's token must be equal; logits
and the KV each row wrote must be within tolerance. Exit status 1 on a mismatch.
Needs polygraphy (pip install polygraphy) and, for a plan, TensorRT and a CUDA GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.comparator import Comparator, SimpleCompareFunc

from trtllm.plugins import cpu as cpu_kernels
from trtllm.runtime import manifest as mf
from trtllm.runtime import lora, sampling

PROMPTS = ([1, 17, 23, 99, 5, 64, 8, 12, 33, 7, 2, 41], [9, 31, 4, 77, 15])


def lora_feeds(m: mf.Manifest) -> dict:
    """A LoRA engine's inputs: a random adapter of rank min(4, max_lora_rank) on every projection,
    shared by the batch, so the comparison covers the LoRA path too."""
    if not m.lora:
        return {}
    rng, r, dtype, out = np.random.default_rng(0), min(4, m.limits.max_lora_rank), lora.dtype_of(m), {}
    for i, module, n_in, n_out, experts in lora.projections(m):
        e = (experts,) if experts else ()
        out[m.io.lora_a.format(i=i, module=module)] = rng.normal(0, 0.05, (1, *e, n_in, r)).astype(dtype)
        out[m.io.lora_b.format(i=i, module=module)] = rng.normal(0, 0.05, (1, *e, r, n_out)).astype(dtype)
    return out


def feeds(m: mf.Manifest) -> tuple[dict, callable]:
    """The prefill feed, and a function making the decode feed from the reference's prefill outputs."""
    io, shape, vocab = m.io, m.model, m.model.vocab_size
    capacity = m.limits.max_kv_cache_capacity
    ids = [[t % vocab for t in p] for p in PROMPTS]
    width, batch = max(map(len, ids)), len(ids)
    params = [sampling.SamplingParams(temperature=0.0), sampling.SamplingParams(temperature=0.7, top_p=0.9)]
    s = sampling.make_batch(params, vocab, m.max_top_k)
    s.uniform[:] = [0.25, 0.75]
    common = {io.logit_bias: s.logit_bias, io.penalty_bias: s.penalty_bias, io.seen: s.seen,
              io.repetition_penalty: s.repetition_penalty, io.temperature: s.temperature, io.min_p: s.min_p,
              io.top_k: s.top_k, io.top_p: s.top_p, io.uniform: s.uniform, **lora_feeds(m)}
    kvs = [np.zeros((batch, heads, capacity, row), shape.kv_dtype) for heads, row in shape.kv_shapes()]  # (per layer)
    prefill = {io.input_ids: np.array([p + [0] * (width - len(p)) for p in ids], np.int64),
               io.position_ids: np.tile(np.arange(width, dtype=np.int64), (batch, 1)),
               io.write_index: np.zeros(batch, np.int64), io.last_index: np.array([len(p) - 1 for p in ids], np.int64),
               io.generated: np.zeros(1, np.int64), **common}  # generated: only graphs on plugins/cpu read it
    # EAGLE engines: verify every prompt position, so verify_ids and eagle_hidden are compared too (the
    # logits of the positions of prompt_logits engines, which take the input as well)
    if m.eagle or m.prompt_logits:
        prefill[io.verify_index] = np.tile(np.arange(width, dtype=np.int64), (batch, 1))
    if m.samples_verified:  # fixed random numbers: the sampled row's verify_ids follow them
        prefill[io.verify_uniform] = np.random.default_rng(0).random((batch, width), dtype=np.float32)
    if m.eagle:
        if m.eagle.get("tree"):  # no tree: the causal mask alone
            prefill[io.tree_mask] = np.zeros((batch, width, 0), np.bool_)
    kv_pairs = io.kv_pairs(shape.num_kv_layers)
    prefill.update((past, kvs[k // 2]) for k, (past, _) in enumerate(kv_pairs))

    def decode(out: dict) -> dict:
        step = {io.input_ids: out[io.token_ids][:, None].astype(np.int64),
                io.position_ids: np.array([[len(p)] for p in ids], np.int64),
                io.write_index: np.array([len(p) for p in ids], np.int64), io.last_index: np.zeros(batch, np.int64),
                io.generated: np.ones(1, np.int64), **common}
        if m.eagle or m.prompt_logits:
            step[io.verify_index] = np.zeros((batch, 1), np.int64)
        if m.samples_verified:
            step[io.verify_uniform] = np.full((batch, 1), 0.5, np.float32)
        if m.eagle:
            if m.eagle.get("tree"):
                step[io.tree_mask] = np.zeros((batch, 1, 0), np.bool_)
        step.update((past, out[present]) for past, present in kv_pairs)
        return step

    return prefill, decode


def compiled_runners(engine_dir: Path, m: mf.Manifest) -> list:
    """One runner per step: the plan with profile 0 then 1, or the ONNX Runtime form twice."""
    if m.backend == "tensorrt":
        from polygraphy.backend.trt import EngineFromBytes, TrtRunner

        if m.tensorrt.get("plugins"):  # a --sampling-plugin plan deserializes only with its plugin registered
            from trtllm.plugins.sample import trt_plugin

            trt_plugin.register()
        plan = (engine_dir / m.files["plan"]).read_bytes()
        return [TrtRunner(EngineFromBytes(plan), name=f"tensorrt-profile{p}", optimization_profile=p) for p in (0, 1)]
    path = str(engine_dir / m.files.get("compiled", m.files["onnx"]))
    return [OnnxrtRunner(compiled_session(path, m), name=f"onnxruntime-compiled-{step}") for step in ("prefill", "decode")]


def as_written(path: str):
    """llm.onnx run as written (graph optimisations off), as TensorRT computes it: ONNX Runtime would
    fuse a quantized projection's DequantizeLinear + MatMul into MatMulNBits, with int8 activations."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return lambda: ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def compiled_session(path: str, m: mf.Manifest):
    """ONNX Runtime's compiled form, with plugins/cpu's kernels registered when the engine uses them."""
    if not cpu_kernels.needed_by(m.lowerings):
        return SessionFromOnnx(path)
    import onnxruntime as ort

    if cpu_kernels.library() is None:
        raise mf.ManifestError(f"{path} needs {cpu_kernels.missing_hint()}")
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(str(cpu_kernels.library()))
    return lambda: ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def kv_error(m: mf.Manifest, ref: dict, got: dict, written: list[int]) -> float:
    """Largest KV difference over the slots each row has written (pad slots are masked, and a
    lowered attention may leave them unwritten)."""
    worst = 0.0
    for _, name in m.io.kv_pairs(m.model.num_kv_layers):
        for b, n in enumerate(written):
            diff = np.abs(ref[name][b, :, :n].astype(np.float64) - got[name][b, :, :n])
            worst = max(worst, float(diff.max()))
    return worst


# the reference is llm.onnx on ONNX Runtime
BFLOAT16_REFUSED = ("a bfloat16 engine's llm.onnx cannot be the reference: ONNX Runtime has no bfloat16 CPU kernels; "
                    "compare a float16 build of the same checkpoint")


def compare(engine_dir: Path, atol: float, rtol: float) -> dict:
    m = mf.load(engine_dir)
    if m.dtype == "bfloat16":
        raise ValueError(BFLOAT16_REFUSED)
    io = m.io
    reference = OnnxrtRunner(as_written(str(engine_dir / m.files["onnx"])), name="onnxruntime-llm.onnx")
    prefill, decode = feeds(m)
    report, ok = {"engine": str(engine_dir), "backend": m.backend, "atol": atol, "rtol": rtol, "steps": []}, True
    feed = prefill
    for step, runner in zip(("prefill", "decode"), compiled_runners(engine_dir, m)):
        results = Comparator.run([reference, runner], data_loader=[feed])
        ref_out, got_out = (dict(r[0]) for _, r in results.items())
        # Sampled rows may legitimately differ (a draw near a CDF boundary), so only the greedy row's token.
        tokens_equal = bool(ref_out[io.token_ids][0] == got_out[io.token_ids][0])
        err = float(np.max(np.abs(ref_out[io.logits].astype(np.float64) - got_out[io.logits])))
        accurate = bool(Comparator.compare_accuracy(results, compare_func=SimpleCompareFunc(
            atol=atol, rtol=rtol, find_output_func=lambda name, idx, other: [name] if name == io.logits else [])))
        kv_err = kv_error(m, ref_out, got_out, written=[len(p) + (step == "decode") for p in PROMPTS])
        report["steps"].append({"step": step, "runner": runner.name, "greedy_token_equal": tokens_equal,
                                "max_abs_logit_error": err, "logits_within_tolerance": accurate,
                                "max_abs_kv_error": kv_err})
        ok &= tokens_equal and accurate and kv_err <= atol + rtol
        valid = [len(p) if step == "prefill" else 1 for p in PROMPTS]  # positions of each row, pads aside
        if m.prompt_logits:  # the logits of every verify_index position (prompt_logprobs)
            pairs = [(ref_out[io.verify_logits][b, :n].astype(np.float64), got_out[io.verify_logits][b, :n])
                     for b, n in enumerate(valid)]
            within = all(bool(np.all(np.abs(r - g) <= atol + rtol * np.abs(r))) for r, g in pairs)
            report["steps"][-1].update(max_abs_prompt_logit_error=max(float(np.max(np.abs(r - g))) for r, g in pairs),
                                       prompt_logits_within_tolerance=within)
            ok &= within
        if m.eagle:  # the greedy tokens at the verified positions, and the draft head's input (pads aside)
            verify_equal = all(np.array_equal(ref_out[io.verify_ids][b, :n], got_out[io.verify_ids][b, :n])
                               for b, n in enumerate(valid))
            hidden = np.concatenate([ref_out[io.eagle_hidden][b, :n] for b, n in enumerate(valid)]).astype(np.float64)
            hidden_err = float(np.max(np.abs(hidden - np.concatenate(
                [got_out[io.eagle_hidden][b, :n] for b, n in enumerate(valid)]))))
            report["steps"][-1].update(verify_ids_equal=verify_equal, max_abs_eagle_hidden_error=hidden_err)
            ok &= verify_equal and hidden_err <= atol + rtol * float(np.abs(hidden).max())
        feed = decode(ref_out)
    report["ok"] = ok
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--atol", type=float, default=None, help="default: 1e-3 float32, 0.05 float16")
    parser.add_argument("--rtol", type=float, default=0.01)
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    dtype = mf.load(args.engine).dtype
    if dtype == "bfloat16":
        print(f"error: {BFLOAT16_REFUSED}", file=sys.stderr)
        return 2
    atol = args.atol if args.atol is not None else (1e-3 if dtype == "float32" else 0.05)
    report = compare(args.engine, atol, args.rtol)
    for s in report["steps"]:
        print(f"{s['step']:8s} {s['runner']:28s} greedy token equal: {s['greedy_token_equal']}  max |logit error| "
              f"{s['max_abs_logit_error']:.3g} (within atol {atol} rtol {args.rtol}: {s['logits_within_tolerance']})  "
              f"max |KV error| {s['max_abs_kv_error']:.3g}")
    print("OK" if report["ok"] else "MISMATCH")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
