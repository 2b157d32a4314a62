"""Check a freshly built engine against transformers before trtllm-build reports success.

1. Exactness (float32 engines): the engine prefills a short prompt and is fed transformers' 8 greedy
   tokens after it; every position's logits must be within `atol` (or RTOL of the largest logit, where
   that is more) of transformers' there (tokens_agree: it chose the same tokens).
2. Agreement (every engine): a fixed English text is fed token by token (teacher forcing); the
   engine's top-1 next token must match transformers' at `min_agreement` of the positions
   (float32 0.98, for ties; float16 0.95; bfloat16 0.93, having 8 significant bits to float16's 11;
   int8 0.93; int4 0.90; with int8 activations int8 0.90 and int4 0.85). The logit error is reported alongside.
3. Bundled LoRA adapters (--lora): 1 and 2 with each adapter, against transformers with the
   adapter merged into its weights.
4. EAGLE (--eagle): the graph's eagle_hidden and the draft head's two steps against the reference
   head of transformers' modules (builder/eagle_reference.py); float32 engines within 1e-3 of the
   largest value and the same proposals, others reported only.
transformers' side of all of it (TransformersSide) is computed first, so that a build can let the
model go before the engine's session is made (builder/build_check.py).
Engine logits that are not finite fail every check. The agreement floor allows at least one
mismatch, for a short text (a small --max-kv-cache-capacity).
`quantization` names the engine's number format: a quantization scheme, or its dtype when unquantized,
and "/int16" or "/int8" for integer activations (--activations, or int8 in ONNX Runtime's MatMulNBits).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from trtllm.builder.verify_logits import (RTOL, BrokenCheckpoint, VerifyError, agreement, allowed_mismatches, check_finite,  # noqa: F401
                                          fits_in_float64,
                                          engine_logits, judge, judge_eagle, measure_eagle, min_agreement,
                                          run_along, save_reference)
from trtllm.builder import held, verify_logits
from trtllm.builder.moe import experts_module
from trtllm.runtime.engine import load_engine

VERIFY_TEXT = "The quick brown fox jumps over the lazy dog. Edge devices run language models"
AGREEMENT_TEXT = (
    "The history of computing is a story of machines that became smaller, faster and cheaper. Early computers "
    "filled whole rooms and needed teams of engineers to keep them running. Today a phone in a pocket holds more "
    "memory than all of them together, and small language models can answer questions without a network. "
    "Running such a model well on a laptop or an embedded board means reading every weight once per token, "
    "so memory bandwidth, not arithmetic, sets the speed. Quantized weights help because they are smaller.")
NUM_DECODE = 8
def hf_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids], dtype=torch.int64)).logits[0].float().numpy()


def near_miss(err: float, atol: float, max_abs_logit: float) -> bool:
    """Whether a float32 engine's logit error is a near miss of its bound (verify_logits.near_miss), where
    transformers in float64 is asked (float64_opinion)."""
    return verify_logits.near_miss(err, verify_logits.logit_bound(atol, max_abs_logit))


def float64_opinion(model, ids: list[int], first: int, got: np.ndarray, ref: np.ndarray) -> dict | None:
    """transformers in float64 as the yardstick of both float32 sides: the engine's logits' distance from
    it, and transformers' own float32's (judge passes the engine within twice the latter). None where a
    float64 copy of the model would take more than half the memory available."""
    if not fits_in_float64(model):
        return None
    wide = held.widened(model).double()
    if getattr(wide.config, "_experts_implementation", None) not in (None, "eager"):
        wide.set_experts_implementation("eager")  # (transformers' grouped_mm experts take no float64)
    with torch.no_grad():
        ref64 = wide(torch.tensor([ids], dtype=torch.int64)).logits[0].double().numpy()[first:]
    del wide
    return {"max_abs_error": float(np.abs(got - ref64).max()),
            "transformers_float32_error": float(np.abs(ref.astype(np.float64) - ref64).max())}


def text_ids(tokenizer, text: str, limit: int) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[:limit] if len(ids) >= 8 else list(range(1, limit + 1))  # tiny test tokenizers may not cover text


def merged_model(model, adapter, manifest):
    """A copy of the transformers model with the adapter merged into its weights (W += (A @ B)^T per
    module, from the engine's own lora_a / lora_b): what the engine must compute with that adapter. (An
    interleaved RoPE's q and k rows are in the engine's order there: put back in the model's.)"""
    from trtllm.runtime.lora import projections, rope_pair_order

    merged, io, rope = held.widened(model), manifest.io, manifest.lora.get("interleaved_rope")
    with torch.no_grad():
        for i, name, _, _, experts in projections(manifest):
            a = adapter.arrays[io.lora_a.format(i=i, module=name)][0].astype(np.float64)  # [in, r] ([E, in, r])
            b = adapter.arrays[io.lora_b.format(i=i, module=name)][0].astype(np.float64)  # [r, out] ([E, r, out])
            if experts:  # the stacked parameter's rows of this projection: [E, out, in] each
                weight, rows = expert_parameter(merged.model.layers[i], name, b.shape[-1])
                weight[:, rows] += torch.from_numpy(np.einsum("eir,ero->eoi", a, b)).to(weight.dtype)
                continue
            weight, delta = merged.model.layers[i].get_submodule(name).weight, (a @ b).T
            if rope and name in ("self_attn.q_proj", "self_attn.k_proj"):
                delta = delta[np.argsort(rope_pair_order(len(delta), manifest.model.head_dim, rope))]
            weight += torch.from_numpy(delta).to(weight.dtype)
    return merged


def expert_parameter(layer, module: str, width: int):
    """transformers' stacked parameter of a routed experts' projection ([E, 2I, H] gate|up, [E, H, I]
    down) and the rows of it `module` is (mlp.experts.gate_proj: the first I)."""
    experts = experts_module(layer)
    kind = module.rsplit(".", 1)[1]
    weight = experts.down_proj if kind == "down_proj" else experts.gate_up_proj
    rows = {"gate_proj": slice(0, width), "up_proj": slice(width, 2 * width)}.get(kind, slice(None))
    return weight, rows


def peft_merged_model(ck, adapter_dir):
    """A copy of the transformers model with the adapter merged by PEFT itself: a reference that
    does not share our reading of the adapter's config (scales, rank and alpha patterns, rsLoRA).
    A vision-language model's adapter names its modules in the whole model: merged there, and its
    language model taken."""
    import peft

    from trtllm.builder import vision

    merged = peft.PeftModel.from_pretrained(held.widened(ck.vision if ck.vision is not None else ck.model),
                                            str(adapter_dir)).merge_and_unload().eval()
    return merged if ck.vision is None else vision.language_model(merged)


def greedy(model, ids: list[int], num_decode: int) -> tuple[list[int], np.ndarray]:
    """transformers' greedy continuation of ids: its num_decode + 1 tokens and the logits it chose them
    from [num_decode + 1, V], each a forward pass over the tokens before (the engine is then fed these,
    and judged on its logits there and on choosing the same tokens)."""
    generated, rows = [], []
    for _ in range(num_decode + 1):
        rows.append(hf_logits(model, ids + generated)[-1])
        generated.append(int(rows[-1].argmax()))
    return generated, np.stack(rows)


def adapter_side(ck, engine_dir, manifest, name: str, ids: list[int], num_decode: int, text: list[int]) -> dict:
    """transformers' side of a bundled adapter's check: the model with it merged (by PEFT when it is
    installed, as `pip install .[build]` does), on the short prompt and the agreement text."""
    from trtllm.runtime import lora

    path = Path(engine_dir) / manifest.lora["adapters"][name]
    try:
        model, reference = peft_merged_model(ck, path if path.is_dir() else path.parent), "peft"
    except ImportError:
        adapter = lora.load_adapter(name, path, manifest)
        model, reference = merged_model(ck.model, adapter, manifest), "the engine's reading of the adapter"
    generated, logits = greedy(model, ids, num_decode)
    return {"reference": reference, "generated": generated, "logits": logits,
            "text_argmax": hf_logits(model, text).argmax(-1)}


def eagle_reference(draft_dir, ck, ids: list[int]) -> dict:
    """The reference head's side of the EAGLE check (verify_logits.measure_eagle): the model's
    eagle_hidden over ids, the head's proposal and hidden state over the prompt's pairs, and a
    second step on its own outputs."""
    from trtllm.builder.eagle_reference import Reference

    ref = Reference(draft_dir, ck.model)
    want = ref.target_hidden(ids)
    hidden = want[:-1]
    ref_ids, ref_h = ref.forward(ids[1:], hidden)
    ref_ids2, ref_h2 = ref.forward(ids[1:] + ref_ids[-1:], torch.cat([hidden, ref_h[-1:]]))
    return {"ids": np.asarray(ids, np.int64), "hidden": want.numpy().astype(np.float32),
            "draft_ids": np.asarray([ref_ids[-1], ref_ids2[-1]], np.int64),
            "draft_hidden": np.stack([ref_h[-1].numpy(), ref_h2[-1].numpy()]).astype(np.float32)}


@dataclasses.dataclass
class TransformersSide:
    """What transformers computes for the build check, all before the engine is compiled: the build lets
    its model go then, so transformers' model and ONNX Runtime's session are never in memory together.
    `float64` gives the near-miss opinion (float64_opinion) of a model it may load again."""
    ids: list[int]           # the exactness prompt
    generated: list[int]     # transformers' greedy tokens after it (NUM_DECODE + 1 at most)
    logits: np.ndarray       # [len(generated), V]: the logits it chose them from
    text: list[int]          # the agreement text, as the engine is fed it
    text_logits: np.ndarray  # [len(text), V]
    adapters: dict           # name -> adapter_side's
    eagle: dict | None       # eagle_reference's
    float64: object          # (ids, first, got, ref) -> float64_opinion's


def transformers_side(ck, manifest, engine_dir, eagle: str | None = None, model_again=None) -> TransformersSide:
    """transformers' side of every check the engine in `engine_dir` (its manifest given, its graphs not
    needed) gets. `model_again`: loads ck.model again for a near miss's float64 opinion, once the
    build has let it go (default: ck.model)."""
    # Every check fits the engine's limits, down to one prompt token and no decode step: a prompt
    # of P tokens and D decode steps fill P + D KV positions (the last token is not fed).
    limits = manifest.limits
    room = limits.max_kv_cache_capacity
    num_decode = min(NUM_DECODE, room // 2)
    ids = text_ids(ck.tokenizer, VERIFY_TEXT, max(1, min(24, limits.max_input_len, room - num_decode)))
    generated, logits = greedy(ck.model, ids, num_decode)
    if not np.isfinite(logits).all():  # not the engine's fault: say whose it is
        raise BrokenCheckpoint("transformers' own logits for this checkpoint are NaN or infinite: the checkpoint "
                               "is broken (NaN or infinite weights, or a config value such as a rope_theta of 0?), "
                               "not the build")
    text = text_ids(ck.tokenizer, AGREEMENT_TEXT, min(128, room + 1))[:-1]  # (the last token is never fed)
    adapters = {name: adapter_side(ck, engine_dir, manifest, name, ids, num_decode, text)
                for name in manifest.lora.get("adapters", {})}
    eagle_ref = None
    if eagle:  # (the head drafts from the prompt's second token: >= 2 tokens; config.py asks max_input_len >= 2)
        eagle_ref = eagle_reference(eagle, ck, text_ids(ck.tokenizer, VERIFY_TEXT,
                                                        max(2, min(24, limits.max_input_len, room))))
    model_again = model_again or (lambda: ck.model)
    return TransformersSide(ids, generated, logits, text, hf_logits(ck.model, text), adapters, eagle_ref,
                            lambda *a: float64_opinion(model_again(), *a))


def verify_engine(engine_dir, ck, quantization: str = "none", atol: float = 1e-3, eagle: str | None = None,
                  engine=None, reference: Path | None = None, draft_engine=None) -> dict:
    """transformers_side, then check_engine: the engine in engine_dir (or `engine`, loaded) against the
    checkpoint `ck`, whose model stays (see check_engine)."""
    from trtllm.runtime import manifest as mf

    manifest = engine.manifest if engine is not None else mf.load(engine_dir)
    side = transformers_side(ck, manifest, engine_dir, eagle)
    return check_engine(engine_dir, side, quantization, atol, engine, reference, draft_engine)


def check_engine(engine_dir, side: TransformersSide, quantization: str = "none", atol: float = 1e-3, engine=None,
                 reference: Path | None = None, draft_engine=None) -> dict:
    """The engine fed transformers' tokens (`side`), its logits and choices against transformers'. `engine`:
    the engine to check, loaded (else the directory's compiled form); it is closed. `reference`: where to
    save transformers' side for the plan step to check a TensorRT plan against (builder/plan.py);
    `draft_engine`: the EAGLE head's, loaded, as `engine`. A VerifyError carries the report so far (the
    build writes it beside the engine it did not replace)."""
    report = {"quantization": quantization}
    try:
        return checked(engine_dir, side, quantization, atol, report, engine, reference, draft_engine)
    except VerifyError as e:
        e.report = report
        raise


def checked(engine_dir, side: TransformersSide, quantization: str, atol: float, report: dict, engine=None,
            reference: Path | None = None, draft_engine=None) -> dict:
    if engine is None:
        engine = load_engine(engine_dir, graph="compiled", huge_pages=False)  # checked, then closed
    try:
        ids, text = side.ids, side.text
        chosen, got, text_chosen, text_got = run_along(engine, ids, side.generated, text)
        ref = side.logits
        err = float(np.abs(got - ref).max())
        report.update(num_positions=int(ref.shape[0]), max_abs_error=err, atol=atol,
                      max_abs_logit=float(np.abs(ref).max()), tokens_agree=chosen == side.generated)
        if quantization in ("none", "float32") and near_miss(err, atol, report["max_abs_logit"]):
            report["float64"] = side.float64(ids + side.generated[:-1], len(ids) - 1, got, ref)
        ref = side.text_logits
        floor, text_top = min_agreement(quantization), ref.argmax(-1)
        report.update(**agreement(text_chosen, text_top), min_agreement=floor,
                      allowed_mismatches=allowed_mismatches(len(text_chosen), floor),
                      agreement_max_abs_error=float(np.abs(text_got - ref).max()),
                      agreement_mean_abs_error=float(np.abs(text_got - ref).mean()))
        adapters = {name: check_adapter(engine, engine_dir, name, a, ids, text)
                    for name, a in side.adapters.items()}
        if adapters:
            report["adapters"] = adapters
        if side.eagle is not None:
            report["eagle"] = measure_eagle(engine, engine_dir, side.eagle, draft_engine)
        if reference is not None:
            save_reference(reference, ids, side.generated, side.logits, text, text_top,
                           {name: (a["generated"], a["logits"], a["text_argmax"]) for name, a in side.adapters.items()},
                           export_error=err, eagle=side.eagle)
    finally:
        engine.close()
    if judge(report, quantization, atol) and "eagle" in report:
        judge_eagle(report["eagle"], atol)
    return report


def check_adapter(engine, engine_dir, name: str, side: dict, ids: list[int], text: list[int]) -> dict:
    """A bundled adapter: the engine's logits with it against transformers with it merged (adapter_side),
    on the short prompt (exactness) and on the agreement text."""
    from trtllm.runtime import lora

    adapter = lora.load_adapter(name, Path(engine_dir) / engine.manifest.lora["adapters"][name], engine.manifest)
    chosen, got, text_chosen, _ = run_along(engine, ids, side["generated"], text, adapter.arrays,
                                            f"with adapter {name} ")
    return {"reference": side["reference"], "max_abs_error": float(np.abs(got - side["logits"]).max()),
            "max_abs_logit": float(np.abs(side["logits"]).max()), "tokens_agree": chosen == side["generated"],
            **agreement(text_chosen, side["text_argmax"])}
