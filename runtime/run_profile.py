"""trtllm-run --profile: the run's figures (runtime/runner.py's Runner counts them in its Timing), in
Edge-LLM's keys (prefill, generation, eagle_generation, stages) and ours (reused and computed
prompt tokens, the KV cache's bytes, n-gram lookup, the context cache, huge pages)."""
from __future__ import annotations

import resource

import numpy as np

from trtllm.runtime.kv_cache import bytes_for, bytes_per_token


def stage(name: str, seconds: list[float]) -> dict:
    """Edge-LLM's `stages` entry (its keys say GPU time; here the wall clock around each engine call)."""
    ms = np.asarray(seconds, np.float64) * 1e3
    stats = {"count": len(ms), "min_ms": ms.min(), "max_ms": ms.max(), "mean_ms": ms.mean(),
             "median_ms": np.median(ms), "p95_ms": np.percentile(ms, 95), "p99_ms": np.percentile(ms, 99),
             "stddev_ms": ms.std()}
    return {"stage_id": name, "total_runs": len(ms), "total_gpu_time_ms": float(ms.sum()),
            "average_time_per_run_ms": float(ms.mean()),
            "gpu_time_stats": {k: v if k == "count" else float(v) for k, v in stats.items()}}


def kv_cache(runner) -> dict:
    """What the KV buffers took, and the most they can take (manifest limits), known up front."""
    m = runner.engine.manifest
    out = {"allocated_bytes": runner.timing.kv_cache_bytes, "bytes_per_token": bytes_per_token(m.model),
           "max_bytes": bytes_for(m.model, m.limits.max_batch_size, m.limits.max_kv_cache_capacity)}
    if runner.drafter is not None or drafts_with_model(runner):  # the EAGLE head's or draft engine's own KV
        out["draft_allocated_bytes"] = runner.timing.draft_kv_bytes
    kv_memory = getattr(runner.engine, "kv_memory", None)  # optional (runtime/engine.py)
    return {**out, **(kv_memory() if kv_memory else {})}


def eagle(runner) -> dict:
    """EAGLE: Edge-LLM's eagle_generation keys, as its runtime counts them (an iteration: one
    sequence's verification round; its generated tokens: those rounds' and its prefill token;
    the acceptance rate: tokens per iteration) but for a run, which here is a sample that
    speculated (batches are in flight, not one run each); and ours (verification steps of the
    batch, the draft head's steps, drafted and accepted tokens, their fraction)."""
    t = runner.timing
    spec_seconds = t.verify_seconds + t.draft_seconds  # Edge-LLM's: all but the base model's prefill
    generated = t.speculative_tokens + t.speculative_rows  # (each speculating sample's prefill token)
    return {"total_runs": t.speculative_rows, "total_iterations": t.row_iterations,
            "total_generated_tokens": generated,
            "average_tokens_per_run": generated / max(t.speculative_rows, 1),
            "average_acceptance_rate": generated / max(t.row_iterations, 1),
            "overall_tokens_per_second_excluding_base_prefill": generated / spec_seconds if spec_seconds else 0.0,
            "verify_steps": t.verify_runs,
            "draft_step": "auto" if runner.drafter.auto else runner.drafter.step,
            "draft_steps": {str(k): n for k, n in sorted(t.draft_steps.items())},
            "drafted_tokens": t.drafted_tokens, "accepted_tokens": t.accepted_tokens,
            "draft_acceptance_rate": t.accepted_tokens / t.drafted_tokens if t.drafted_tokens else 0.0,
            "draft_top_k": runner.drafter.top_k, "branch_tokens": t.branch_tokens,
            "draft_runs": t.draft_runs, "draft_time_ms": 1e3 * t.draft_seconds}


def drafts_with_model(runner) -> bool:
    return getattr(runner.lookup, "engine", None) is not None  # (runtime/draft_model.py's DraftModel)


def ngram(runner) -> dict:
    """--spec-ngram and --spec-draft-engine: the steps that checked guesses, the guesses and those
    taken; and a draft engine's steps and their time."""
    t = runner.timing
    out = {"draft_step": runner.lookup.k, "verify_steps": t.verify_runs, "drafted_tokens": t.drafted_tokens,
           "accepted_tokens": t.accepted_tokens,
           "draft_acceptance_rate": t.accepted_tokens / t.drafted_tokens if t.drafted_tokens else 0.0}
    if drafts_with_model(runner):
        out.update(draft_step="auto" if runner.lookup.adaptive else runner.lookup.k, draft_runs=t.draft_runs,
                   draft_time_ms=1e3 * t.draft_seconds)
    return out


def multimodal(runner) -> dict:
    """Edge-LLM's multimodal entry: the vision graph's runs (one an image), the images and their tokens."""
    t = runner.timing
    seconds = t.stages.get("vision_encoder", [])
    return {"total_runs": len(seconds), "total_images": t.images, "total_image_tokens": t.image_tokens,
            "total_audios": 0, "total_audio_tokens": 0, "total_multimodal_tokens": t.image_tokens,
            "average_time_per_token_ms": 1e3 * sum(seconds) / max(t.image_tokens, 1)}


def of(runner) -> dict:
    """The --profile file's object: Edge-LLM's keys for a run, and ours."""
    t = runner.timing
    gen_tokens = t.generated_tokens  # decode steps only: each prefill's first token is prefill's
    prompt_tokens = t.prefill_tokens + t.reused_tokens  # Edge-LLM's per-run and per-token figures count both
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "prefill": {"total_runs": t.prefill_runs, "reused_tokens": t.reused_tokens,
                    "computed_tokens": t.prefill_tokens,
                    "average_tokens_per_run": prompt_tokens / max(t.prefill_runs, 1),
                    "average_time_per_run_ms": 1e3 * t.prefill_seconds / max(t.prefill_runs, 1),
                    "tokens_per_second": prompt_tokens / t.prefill_seconds if t.prefill_seconds else 0.0,
                    "average_time_per_token_ms": 1e3 * t.prefill_seconds / max(prompt_tokens, 1),
                    "computed_tokens_per_second":
                        t.prefill_tokens / t.prefill_seconds if t.prefill_seconds else 0.0},
        "generation": {"total_runs": t.generation_runs, "generated_tokens": gen_tokens,
                       "average_tokens_per_run": gen_tokens / max(t.generation_runs, 1),
                       "tokens_per_second": gen_tokens / t.generation_seconds if t.generation_seconds else 0.0,
                       "average_time_per_token_ms": 1e3 * t.generation_seconds / max(gen_tokens, 1)},
        **({"eagle_generation": eagle(runner)} if runner.drafter is not None else {}),
        **({"draft_model_generation" if drafts_with_model(runner) else "ngram_generation": ngram(runner)}
           if runner.lookup is not None else {}),
        **({"multimodal": multimodal(runner)} if runner.engine.manifest.vision else {}),
        "peak_cpu_memory_bytes": rss, "peak_cpu_memory_mb": rss / 2**20,
        **(device() if (device := getattr(runner.engine, "device_memory", None)) else {}),
        "kv_cache": kv_cache(runner),
        **({"context_cache": runner.contexts.profile()} if runner.contexts is not None else {}),
        "stages": [stage(name, times) for name, times in t.stages.items()],
        **({"huge_pages": hp.to_json()} if (hp := getattr(runner.engine, "huge_pages", None)) else {}),
    }
