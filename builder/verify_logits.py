"""The engine side of the build check (builder/verify.py), without torch: the engine's logits for a
prompt and its greedy continuation, the floors of top-1 agreement per number format, and the
checks on them. `python -m trtllm.builder.plan` checks a plan built on the device with these,
against the reference the export recorded."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from trtllm.builder.config import CheckpointError
from trtllm.runtime import kv_cache, sampling
from trtllm.runtime import manifest as mf
from trtllm.runtime.generate import RowState, decode_inputs, prefill_inputs

# With int8 activations (llama.cpp's numerics) the demo model measured 89-94% (int4) and 98% (int8),
# moving with the kernels' float sum order: their floors are lower, and still far above a broken
# build (58% for symmetric int4). int16 activations keep their weights' floors (measured 100%).
MIN_AGREEMENT = {"none": 0.98, "float32": 0.98, "float16": 0.95, "bfloat16": 0.93, "int8": 0.93, "int4": 0.90,
                 "int8/int16": 0.93, "int4/int16": 0.90, "int8/int8": 0.90, "int4/int8": 0.85}
# An int8 KV cache (" kv-int8" after the format) holds each key and value within 1/254 of its row's
# largest: its floor is the format's, at most KV_INT8_FLOOR. An int4 lm_head (" lm_head-int4",
# --lm-head-quantization int4) moves every logit: the demo model measured 80% (int4 layers), a broken
# build far less (58% for symmetric int4 layers), so at most LM_HEAD_INT4_FLOOR.
KV_INT8_FLOOR = 0.93
LM_HEAD_INT4_FLOOR = 0.70
FLOORS = {"kv-int8": KV_INT8_FLOOR, "lm_head-int4": LM_HEAD_INT4_FLOOR}


def min_agreement(quantization: str) -> float:
    fmt, *flags = quantization.split(" ")
    return min([MIN_AGREEMENT[fmt]] + [FLOORS[flag] for flag in flags])


RTOL = 1e-5  # float32 engines' logits: this much of the largest logit, where that is more than atol


class VerifyError(RuntimeError):
    """The engine's logits differ from transformers'; `report`: what was measured up to there."""

    report: dict | None = None


class BrokenCheckpoint(VerifyError, CheckpointError):
    """transformers' own logits are not finite: the checkpoint is at fault, not the build (a bad
    checkpoint, as any other: trtllm-build exits 2)."""


def engine_logits(engine, prompt_ids: list[int], num_decode: int, forced: list[int] | None = None,
                  lora: dict | None = None, images=None):
    """Prefill prompt_ids, then decode greedily (or feed `forced` tokens); returns the engine's
    chosen ids and its logits [1 + num_decode, V]. `lora`: an adapter's arrays (runtime/lora.py);
    `images`: the prompt's (runtime/media.py PromptImages), on a vision-language engine."""
    params = sampling.SamplingParams(temperature=0.0, max_new_tokens=num_decode + 1)
    row = RowState(prompt_ids=prompt_ids, params=params, rng=np.random.default_rng(0), eos_ids=frozenset(),
                   images=images)
    batch = sampling.make_batch([params], engine.manifest.model.vocab_size, engine.manifest.max_top_k)
    kv = kv_cache.for_engine(engine, 1, len(prompt_ids) + num_decode)  # (the last token is never fed)
    inputs, logits, chosen = prefill_inputs([row], engine.manifest.pad_token_id, batch), [], []
    vocab = engine.manifest.model.vocab_size
    for step in range(num_decode + 1):
        out = engine.step(dataclasses.replace(inputs, lora=lora), kv.view(0, 1), want_logits=True)
        logits.append(out.logits[0].copy())
        chosen.append(int(out.token_ids[0]))
        if not np.isfinite(logits[-1]).all() or not 0 <= chosen[-1] < vocab:
            # (overflowed: the sampler's answer may be past the vocabulary, and fed back it would be read
            # out of the embedding's bounds; the rest count as not finite too, for check_finite to report)
            missing = num_decode - step
            logits += [np.full_like(logits[-1], np.nan)] * missing
            chosen += [-1] * missing
            break
        if step == num_decode:  # (the last logits: nothing more is fed, `forced` may end here)
            break
        row.output_ids.append(forced[step] if forced else chosen[-1])
        inputs = decode_inputs([row], engine.manifest.pad_token_id, batch)
    return chosen, np.stack(logits)


def run_along(engine, ids: list[int], generated: list[int], text: list[int], lora: dict | None = None,
              what: str = "") -> tuple[list[int], np.ndarray, list[int], np.ndarray]:
    """The engine along recorded tokens, as every check runs it: the prompt `ids` then transformers'
    `generated` tokens fed one by one, and the agreement `text` (the tokens fed) likewise; its choices
    and logits at each position of both [(chosen, logits), (text chosen, text logits)], none NaN."""
    chosen, got = engine_logits(engine, ids, len(generated) - 1, forced=generated, lora=lora)
    check_finite(got, what)
    text_chosen, text_got = engine_logits(engine, text[:1], len(text) - 1, forced=text[1:], lora=lora)
    check_finite(text_got, what)
    return chosen, got, text_chosen, text_got


def check_finite(logits: np.ndarray, what: str = "") -> None:
    # A NaN would also slip through every `error > atol` test below: refuse it outright.
    bad = ~np.isfinite(logits).all(axis=-1)
    if bad.any():
        raise VerifyError(f"the engine's logits {what}are not finite at {int(bad.sum())} of {len(bad)} positions; "
                          "the build is wrong. Rebuild with --no-verify only to inspect it")


def agreement(chosen: list[int], ref_ids: np.ndarray) -> dict:
    """Teacher-forced top-1 agreement: the engine's chosen ids against transformers' top-1 ids."""
    mismatches = int(np.sum(np.array(chosen) != ref_ids))
    return {"agreement_positions": len(chosen), "top1_agreement": 1 - mismatches / len(chosen),
            "mismatches": mismatches}


def allowed_mismatches(positions: int, floor: float) -> int:
    """The floor's share of the positions, but at least one (a tie), so a short text at a small KV
    capacity is not failed by one."""
    return max(1, int((1 - floor) * positions + 1e-9))


def measure_eagle(engine, engine_dir, ref: dict, draft_engine=None) -> dict:
    """The EAGLE check's engine side, against the reference head's arrays (verify.eagle_reference):
    the graph's eagle_hidden over the prompt, then the draft head on the reference's hidden states
    (so each graph is judged alone), and a second step on the reference's own outputs.
    `draft_engine`: the head's engine, loaded (else the engine directory's); it is closed."""
    from trtllm.runtime.drafter import Drafter

    m, ids = engine.manifest, [int(t) for t in ref["ids"]]
    params = sampling.SamplingParams(temperature=0.0)
    batch = sampling.make_batch([params], m.model.vocab_size, m.max_top_k)
    row = RowState(prompt_ids=ids, params=params, rng=np.random.default_rng(0), eos_ids=frozenset())
    base_kv = kv_cache.for_engine(engine, 1, len(ids))  # (held: a view does not keep device buffers alive)
    out = engine.step(prefill_inputs([row], m.pad_token_id, batch), base_kv.view(0, 1))
    drafter = Drafter(draft_engine, 1) if draft_engine is not None else Drafter.load(engine_dir, m, huge_pages=False)
    try:
        kv = kv_cache.for_engine(drafter.engine, 1, len(ids))
        n, hidden, first = len(ids) - 1, np.asarray(ref["hidden"])[:-1], int(ref["draft_ids"][0])
        got_id, got_h = drafter.engine.draft(np.array([ids[1:]]), hidden[None], np.arange(n)[None], np.array([0]),
                                             np.array([n - 1]), kv.view(0, 1))
        got_id2, got_h2 = drafter.engine.draft(np.array([[first]]), np.asarray(ref["draft_hidden"])[:1][None],
                                               np.array([[n]]), np.array([n]), np.array([0]), kv.view(0, 1))
    finally:
        drafter.close()
    draft_ref = np.asarray(ref["draft_hidden"])
    return {"hidden_max_abs_error": float(np.abs(out.hidden[0] - ref["hidden"]).max()),
            "hidden_max_abs": float(np.abs(ref["hidden"]).max()),
            "draft_max_abs_error": float(np.abs(np.stack([got_h[0], got_h2[0]]) - draft_ref).max()),
            "draft_max_abs": float(np.abs(draft_ref).max()),
            "proposals_agree": [int(got_id[0]), int(got_id2[0])] == [int(t) for t in ref["draft_ids"]]}


def judge_eagle(e: dict, atol: float) -> None:
    """A float32 engine's EAGLE outputs within atol of their largest value, and the same proposals."""
    if not (e["hidden_max_abs_error"] <= atol * max(1.0, e["hidden_max_abs"])
            and e["draft_max_abs_error"] <= atol * max(1.0, e["draft_max_abs"]) and e["proposals_agree"]):
        raise VerifyError(f"the EAGLE outputs differ from the reference head (eagle_hidden by "
                          f"{e['hidden_max_abs_error']:.3g}, the draft head's hidden state by {e['draft_max_abs_error']:.3g}, "
                          f"proposals agree: {e['proposals_agree']}); the build is wrong. Rebuild with --no-verify only "
                          "to inspect it")


def number_format(manifest: mf.Manifest) -> str:
    """What verify.py calls the engine's numbers, as its manifest records them: int8, int4, int4/int8
    (activations: quant_activations) or the dtype, " kv-int8" after it with an int8 KV cache, and
    " lm_head-int4" with an int4 lm_head (--lm-head-quantization int4)."""
    kv = " kv-int8" if manifest.model.kv_dtype == "int8" else ""
    if manifest.quantization == "none":
        return manifest.dtype + kv
    scheme = manifest.quantization_scheme
    activations = scheme.get("activations", "float32")
    head = " lm_head-int4" if (scheme.get("lm_head_bits") or scheme.get("bits")) == 4 else ""
    return manifest.quantization + ("" if activations == "float32" else "/" + activations) + kv + head


def logit_bound(atol: float, max_abs_logit: float) -> float:
    """A float32 engine's logit tolerance: atol, or RTOL of the largest logit where logits are that large (a
    model whose logits reach 28,000 is off by 0.01 in float32 arithmetic, 3.4e-7 of it)."""
    return max(atol, RTOL * max_abs_logit)


def near_miss(error: float, bound: float) -> bool:
    """Whether an error is past its bound by less than 10x: what float32 arithmetic in another order can come
    to on a model that amplifies it (random weights of a large spread, say), where float64 is asked."""
    return bound < error <= 10 * bound


def float64_close(wide: dict | None, bound: float) -> bool:
    """A near miss (verify.float64_opinion) passes where the engine is as close to transformers in float64
    as twice transformers' own float32 is (or within the bound of it): float32 rounding, not a wrong graph."""
    return wide is not None and wide["max_abs_error"] <= max(bound, 2 * wide["transformers_float32_error"])


def judge(report: dict, quantization: str, atol: float) -> bool:
    """Raise VerifyError where the report's figures (and each adapter's) miss their bounds; returns
    whether the format is held to exactness (float32). Written `not err <= bound` so that a NaN fails."""
    exact = quantization in ("none", "float32")
    for name, r in [("", report)] + [(f"with adapter {n} ", r) for n, r in report.get("adapters", {}).items()]:
        bound = logit_bound(atol, r["max_abs_logit"])
        if exact and not r["max_abs_error"] <= bound and not float64_close(r.get("float64"), bound):
            wide = r.get("float64")
            raise VerifyError(f"engine logits {name}differ from transformers by up to {r['max_abs_error']:.3g} "
                              f"(> {bound:.3g}" + (f"; {wide['max_abs_error']:.3g} from transformers in float64, whose own "
                                                  f"float32 is {wide['transformers_float32_error']:.3g} from it"
                                                  if wide else "") +
                              "); the build is wrong. Rebuild with --no-verify only to inspect it")
        if r["mismatches"] > report["allowed_mismatches"]:
            raise VerifyError(f"the engine's top-1 token {name}agrees with transformers at {r['top1_agreement']:.1%} "
                              f"of {r['agreement_positions']} positions ({r['mismatches']} differ, more than "
                              f"{report['allowed_mismatches']}: the {report['min_agreement']:.0%} floor); the build is too "
                              "inaccurate. Rebuild with --no-verify only to inspect it")
    return exact


# transformers' side of the build check, kept in a TensorRT engine for its plan step (builder/plan.py)
REFERENCE_NAME = "verify_reference.npz"


def save_reference(path: Path, ids, generated, logits, text, text_argmax, adapters: dict | None = None,
                   export_error: float = 0.0, eagle: dict | None = None) -> None:
    """The check's prompt, the tokens it continued with and transformers' logits there (float32),
    and the agreement text with transformers' top-1 token at each of its positions; for each bundled
    adapter (name -> (generated, logits, text_argmax)) the same with it merged; the exported
    graph's own largest logit error there (a 16-bit plan's is bounded by a multiple of it); and the
    reference EAGLE head's arrays (verify.eagle_reference), as "eagle/NAME"."""
    arrays = {"ids": np.asarray(ids, np.int64), "text": np.asarray(text, np.int64),
              "export_error": np.float64(export_error), **{f"eagle/{k}": v for k, v in (eagle or {}).items()}}
    for prefix, (gen, lg, top) in {"": (generated, logits, text_argmax), **{f"adapter/{n}/": v for n, v in
                                                                           (adapters or {}).items()}}.items():
        arrays.update({f"{prefix}generated": np.asarray(gen, np.int64), f"{prefix}logits": np.asarray(lg, np.float32),
                       f"{prefix}text_argmax": np.asarray(top, np.int64)})
    with open(path, "wb") as f:  # (np.savez would add .npz to a name without it)
        np.savez(f, **arrays)


# A 16-bit plan against the exported graph's own logit error (ONNX Runtime or TensorRT at the export):
# GPU kernels round otherwise, but not by an order of magnitude; a twentieth of the largest logit is
# the floor for an export that happened to land near transformers.
PLAN_ERROR_FACTOR, PLAN_ERROR_SHARE = 10.0, 0.05


def check_against_reference(engine, path: Path, quantization: str, atol: float = 1e-3) -> dict:
    """The build check's 1, 2 and 3 for an engine whose checkpoint is not here (a plan built on the
    device): its logits along the recorded tokens against transformers' recorded ones, alone and
    with each bundled adapter."""
    from trtllm.runtime import lora

    ref = np.load(path)
    ids, text = [int(t) for t in ref["ids"]], [int(t) for t in ref["text"]]
    floor = min_agreement(quantization)
    report = {"quantization": quantization, "against": path.name, "min_agreement": floor,
              "allowed_mismatches": allowed_mismatches(len(text), floor)}

    def measured(prefix: str, arrays: dict | None, what: str) -> dict:
        generated, want = [int(t) for t in ref[f"{prefix}generated"]], ref[f"{prefix}logits"]
        # fed the tokens transformers was fed (its own greedy ones may differ where the logits near-tie)
        _, got, chosen, _ = run_along(engine, ids, generated, text, arrays, what)
        return {"num_positions": int(want.shape[0]), "max_abs_error": float(np.abs(got - want).max()),
                "max_abs_logit": float(np.abs(want).max()), "atol": atol,
                "tokens_agree": [int(t) for t in want.argmax(-1)] == [int(t) for t in got.argmax(-1)],
                **agreement(chosen, ref[f"{prefix}text_argmax"])}

    try:
        report.update(measured("", None, ""))
        if quantization.split(" ")[0] in ("float16", "bfloat16") and "export_error" in ref.files:
            # the build's check bounds no 16-bit logit error (agreement only); here the graph's own error
            # at the export is known: a plan far past it computes something else (logits scaled, say)
            bound = max(PLAN_ERROR_FACTOR * float(ref["export_error"]), PLAN_ERROR_SHARE * report["max_abs_logit"])
            report.update(export_error=float(ref["export_error"]), error_bound=bound)
            if not report["max_abs_error"] <= bound:
                raise VerifyError(f"the plan's logits differ from transformers by up to {report['max_abs_error']:.3g}, "
                                  f"past {bound:.3g} ({PLAN_ERROR_FACTOR}x the exported graph's own error, "
                                  f"{float(ref['export_error']):.3g}, or {PLAN_ERROR_SHARE:.0%} of the largest "
                                  "logit); the plan is wrong. Run with --no-verify only to inspect it")
        m = engine.manifest
        if m.eagle:
            if "eagle/ids" not in ref.files:
                raise VerifyError(f"{path.name} holds no reference for the EAGLE draft head (exported before the plan "
                                  "step checked one): export the engine again with trtllm-build, or pass --no-verify")
            report["eagle"] = measure_eagle(engine, engine.engine_dir, {k.removeprefix("eagle/"): ref[k]
                                                                        for k in ref.files if k.startswith("eagle/")})
        for name, rel in m.lora.get("adapters", {}).items():
            if f"adapter/{name}/logits" not in ref.files:
                raise VerifyError(f"{path.name} holds no reference for the bundled adapter {name}: rebuild the "
                                  "engine with trtllm-build, or pass --no-verify")
            adapter = lora.load_adapter(name, Path(engine.engine_dir) / rel, m)
            report.setdefault("adapters", {})[name] = measured(f"adapter/{name}/", adapter.arrays,
                                                               f"with adapter {name} ")
        if judge(report, quantization, atol) and "eagle" in report:
            judge_eagle(report["eagle"], atol)
    except VerifyError as e:
        e.report = report
        raise
    return report


VISION_REFERENCE_NAME = "vision_reference.npz"  # a TensorRT VLM's: pixels and transformers' embeddings of them


def embeddings_error(ours: np.ndarray, want: np.ndarray, what: str, float64=None) -> float:
    """max |ours - want| of image embeddings against transformers' `want`: every vision check (the
    graphs, their ONNX Runtime form, the plan) holds them within 1e-4 of want's largest value (or of
    1); beyond that, or in another shape, VerifyError names `what`. `float64()`: transformers' embeddings
    in float64 (or None), asked where the error is past the bound by less than 10x: ours then pass within
    twice transformers' own float32 distance from them (float32 rounding that an encoder of widely spread
    random weights amplifies, as the logits' check judges it: verify.float64_opinion)."""
    scale = float(np.abs(want).max())
    error = float(np.abs(ours - want).max()) if ours.shape == want.shape else float("inf")
    bound = 1e-4 * max(1.0, scale)
    if near_miss(error, bound) and float64 is not None:
        wide = float64()
        if wide is not None and float64_close({"max_abs_error": float(np.abs(ours - wide).max()),
                                               "transformers_float32_error": float(np.abs(want - wide).max())}, bound):
            return error
    if not error <= bound:
        raise VerifyError(f"{what}'s image embeddings differ from transformers': max |error| {error:.3g} (largest "
                          f"value {scale:.3g}; shapes {list(ours.shape)} and {list(want.shape)})")
    return error


def check_vision_plan(engine_dir: Path, manifest: mf.Manifest) -> dict:
    """vision.plan on the export's reference pixels against transformers' embeddings of them (as the
    build checks vision.onnx: within 1e-4 of the largest value); a mismatch raises VerifyError."""
    from trtllm.runtime.backends.tensorrt_vision import TensorRTVision

    ref = np.load(Path(engine_dir) / VISION_REFERENCE_NAME)
    encoder = TensorRTVision(engine_dir, manifest)
    try:  # (Qwen's: the graph's feeds, and its rows' order back to transformers')
        ours = encoder({k: ref[k] for k in ref.files if k not in ("image_embeds", "unpermute")})
    finally:
        encoder.close()
    if "unpermute" in ref.files:
        ours = ours[ref["unpermute"]]
    want = ref["image_embeds"]
    report = {"max_abs_value": float(np.abs(want).max()), "tiles": int(len(ref["pixel_values"]))}
    try:
        report["max_abs_error"] = embeddings_error(ours, want, "the vision plan")
    except VerifyError as e:
        e.report = {"vision_plan": report}
        raise
    return report


def available_memory() -> int:
    """Bytes of memory available (Linux's MemAvailable; 0 elsewhere: no float64 copy is made)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 0


def fits_in_float64(model) -> bool:
    """Whether a float64 copy of `model` takes at most half the memory available."""
    return sum(p.numel() for p in model.parameters()) * 8 <= available_memory() / 2
