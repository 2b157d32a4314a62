"""A TensorRT engine's plan, built from its llm.onnx on the machine that will run it:
`python -m trtllm.builder.plan ENGINE_DIR`.

trtllm-build writes the plan itself where TensorRT is (`--backend tensorrt`). Where the checkpoint's
tools cannot run beside TensorRT (JetPack 6: TensorRT's Python bindings are for its Python 3.10,
transformers 5 needs 3.11), `trtllm-build --plan-later` exports the engine on another machine and
this module builds its plan on the device: no torch, no transformers, only TensorRT, onnx (the op
lint) and the runtime. It also builds a plan again for another TensorRT version or GPU. The plan is
checked against what transformers computed at export (verify_reference.npz), with the build check's
bounds (builder/verify_logits.py), before it replaces anything.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from trtllm.builder import tensorrt as trt_build
from trtllm.builder.engine_dir import CHECKSUMS_NAME, file_sha256, read_checksums
from trtllm.plugins import lint
from trtllm.runtime import manifest as mf

def build_tensorrt(out_dir: Path, options, manifest: mf.Manifest, log, source: Path | None = None) -> mf.Manifest:
    """llm.onnx -> llm.plan (and the EAGLE head's plan, and vision.onnx's), the graphs read from `source` (else
    out_dir), the plans written to out_dir; returns the manifest with its tensorrt section (version,
    GPU, profiles). `options`: sampling_plugin, workspace_gib, opt_level, timing_cache, graph and
    trt_version (a BuildConfig, or the plan step's)."""
    trt = trt_build.import_tensorrt()
    source = source or out_dir
    onnx_name = manifest.files.get("onnx", "llm.onnx")
    lint.check_model(source / onnx_name, trt_build.minor_version(trt))  # the graph must parse on the TensorRT here
    profiles = trt_build.optimization_profiles(manifest.limits, manifest.model, manifest.io, manifest.lora,
                                               eagle=bool(manifest.eagle), vision=manifest.vision)
    plugins = []
    if options.sampling_plugin:  # registered before parsing, so the parser picks it over the ONNX body
        from trtllm.plugins.sample import trt_plugin

        trt_plugin.register()
        plugins.append(trt_plugin.PLUGIN_ID)
    timing_cache = Path(options.timing_cache) if options.timing_cache else None

    def plan_of(onnx_path: Path, shapes, name: str) -> None:
        plan = trt_build.build_plan(onnx_path, shapes, workspace_gib=options.workspace_gib,
                                    opt_level=options.opt_level, timing_cache=timing_cache, log=log,
                                    sample_plugin=options.sampling_plugin)
        (out_dir / name).write_bytes(plan)
        log(f"wrote {name} ({len(plan) / 2**20:.1f} MiB)")

    plan_of(source / onnx_name, profiles, manifest.files.get("plan", trt_build.PLAN_NAME))
    section = trt_build.manifest_section(trt.__version__, trt_build.gpu_info(), profiles, options.graph,
                                         options.trt_version, plugins)
    if manifest.eagle:  # the draft head's own plan, built the same way
        lint.check_model(source / manifest.eagle["onnx"], trt_build.minor_version(trt))
        draft = trt_build.draft_profiles(manifest.limits, mf.ModelShape(**manifest.eagle["model"]), manifest.io)
        plan_of(source / manifest.eagle["onnx"], draft, manifest.eagle["plan"])
        manifest = dataclasses.replace(manifest, eagle={**manifest.eagle, "profiles": [p.to_json() for p in draft]})
    if manifest.vision:  # the image encoder's plan (float32, one profile: tiles, or a Qwen image's patches)
        lint.check_model(source / manifest.vision["graph"], trt_build.minor_version(trt))
        shapes = trt_build.vision_profiles(manifest.vision, source / manifest.vision["graph"])
        plan_of(source / manifest.vision["graph"], shapes, manifest.files["vision_plan"])  # (no sampler in it)
        manifest = dataclasses.replace(manifest, vision={**manifest.vision, "profiles": [p.to_json() for p in shapes]})
    return dataclasses.replace(manifest, tensorrt=section)


@dataclasses.dataclass
class PlanOptions:
    graph: str
    trt_version: str
    sampling_plugin: bool = False
    workspace_gib: float = 4.0
    opt_level: int = 3
    timing_cache: str | None = None


def plan_engine(engine_dir: Path, options: PlanOptions, verify: bool = True, log=print) -> dict | None:
    """Build ENGINE_DIR's plan here and check it against the export's reference, in a staging
    directory inside it (its files linked, the plans and manifest new); then the manifest says the
    plan is pending, the plans and verify.json replace the engine's, and the new manifest comes
    last: an interruption anywhere leaves an engine this step takes again. Returns the check's
    report (None without one)."""
    from trtllm.builder.verify_logits import REFERENCE_NAME, check_against_reference, check_vision_plan, number_format
    from trtllm.runtime.engine import load_engine

    engine_dir = Path(engine_dir).resolve()
    manifest = mf.load(engine_dir, planning=True)  # (its plans, if any, may be missing or damaged)
    reference = engine_dir / REFERENCE_NAME
    refuse(engine_dir, manifest, reference if verify else None)
    plans = [manifest.files.get("plan", trt_build.PLAN_NAME)] + ([manifest.eagle["plan"]] if manifest.eagle else []) \
        + ([manifest.files["vision_plan"]] if manifest.vision else [])
    written = [*plans, VERIFY_NAME, mf.MANIFEST_NAME]
    check_copy(engine_dir, written)
    stage = Path(tempfile.mkdtemp(dir=engine_dir, prefix=".plan.partial-"))
    try:
        for path in sorted(engine_dir.rglob("*")):  # the engine's files, linked: the plans and the manifest are new
            rel = path.relative_to(engine_dir)
            if rel.parts[0].startswith(".plan.partial-"):
                continue
            if path.is_dir():
                (stage / rel).mkdir(exist_ok=True)
            elif rel.as_posix() not in written:
                (stage / rel).symlink_to(path)  # (what the runtime reads; the graphs are read where they are)
        built = build_tensorrt(stage, options, manifest, log, source=engine_dir)
        built = dataclasses.replace(built, sizes={**manifest.sizes, **{name: (stage / name).stat().st_size
                                                                       for name in plans}})
        mf.save(built, stage)
        report = None
        if verify:
            engine = load_engine(stage)
            try:
                report = check_against_reference(engine, reference, number_format(built))
            finally:
                engine.close()
            if built.vision:  # the image encoder's plan against transformers' embeddings of the export
                report["vision_plan"] = check_vision_plan(stage, built)
                log(f"verified the vision plan: max |error| {report['vision_plan']['max_abs_error']:.2e} of the image "
                    "embeddings transformers gave at the export")
            log(f"verified the plan against transformers' logits recorded at the export: max |logit error| "
                f"{report['max_abs_error']:.2e}; top-1 agreement {report['top1_agreement']:.1%} over "
                f"{report['agreement_positions']} positions" + (f", and with {len(report['adapters'])} adapters"
                                                                 if report.get("adapters") else "")
                + (f"; the EAGLE head's proposals agree: {report['eagle']['proposals_agree']}"
                   if report.get("eagle") else ""))
        checks = engine_dir / VERIFY_NAME  # the export's check (through ONNX Runtime), and the plan's beside it
        previous = json.loads(checks.read_text()) if checks.is_file() else {}
        (stage / VERIFY_NAME).write_text(json.dumps({**previous, "plan": report or "not verified"}, indent=2) + "\n")
        mf.save(manifest, engine_dir)  # pending (as loaded for planning): what the swap leaves if it stops
        for name in written[:-1]:
            os.replace(stage / name, engine_dir / name)
        os.replace(stage / mf.MANIFEST_NAME, engine_dir / mf.MANIFEST_NAME)  # last: it names what is there
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    try:
        update_checksums(engine_dir, written)
    except OSError as e:  # (a disk that filled with the plan): the plan is there and loads
        raise ChecksumsNotUpdated(f"the plan is built and installed, but {engine_dir / CHECKSUMS_NAME} could not be "
                                  f"updated ({e.strerror or e}): it lists the files as they were before the plan "
                                  "step; free some space and run the plan step again") from e
    return report


class ChecksumsNotUpdated(Exception):
    """The last of the plan step's writes failed: not 'the plan was not built'."""


VERIFY_NAME = "verify.json"


def refuse(engine_dir: Path, manifest: mf.Manifest, reference: Path | None) -> None:
    """What stops the plan step before any work: an engine it cannot plan or write, no TensorRT or
    GPU here, a graph this TensorRT cannot parse, nothing to check the plan against."""
    from trtllm.builder.config import MODERN_MIN_TRT, legacy_profile_hint, parse_trt_version

    if manifest.backend != "tensorrt":
        raise mf.ManifestError(f"{engine_dir} is an ONNX Runtime engine: it has no TensorRT plan to build")
    if not os.access(engine_dir, os.W_OK):
        raise mf.ManifestError(f"{engine_dir} is not writable: the plan step writes the plan into it")
    usable, why = trt_build.availability()
    if not usable:  # (the plan is this machine's TensorRT and GPU's: build it where the engine will run)
        raise trt_build.TensorRTUnavailable(f"the plan step needs TensorRT and a CUDA GPU: {why}; run it on the "
                                            "device the engine is for (on Jetson, TensorRT comes with JetPack: "
                                            "python3-libnvinfer)")
    version = trt_build.minor_version(trt_build.import_tensorrt())
    if manifest.graph_profile == "modern" and parse_trt_version(version) < MODERN_MIN_TRT:
        raise mf.ManifestError(f"{engine_dir} holds the modern graph (opset 24 Attention, TensorScatter), which "
                               f"TensorRT {version} cannot parse (it needs >= 10.15): export it again with "
                               f"{legacy_profile_hint(version)}, the legacy graph")
    if reference is None:
        return
    if not reference.is_file():
        raise mf.ManifestError(f"{reference} is missing (an engine built with --no-verify, or before the plan step): "
                               "nothing to check a plan against; rebuild it with trtllm-build, or pass --no-verify")


def check_copy(engine_dir: Path, written: list[str]) -> None:
    """Every file checksums.sha256 lists, but those the plan step writes, as the build wrote it: the
    plan step would otherwise list a damaged copy's files as good."""
    for name, digest in read_checksums(engine_dir).items():
        if name in written:
            continue
        path = engine_dir / name
        if not path.is_file() or file_sha256(path) != digest:
            state = "missing" if not path.is_file() else "not the file the build wrote"
            raise mf.ManifestError(f"{path} is {state} ({CHECKSUMS_NAME}): the engine was damaged on its way here "
                                   "(an interrupted copy?); copy it again whole")


def update_checksums(engine_dir: Path, written: list[str]) -> None:
    """checksums.sha256 with the lines of the files the plan step wrote computed anew, the others kept."""
    listed, lines = engine_dir / CHECKSUMS_NAME, read_checksums(engine_dir)
    for name in written:
        if (engine_dir / name).is_file():
            lines[name] = file_sha256(engine_dir / name)
    # (a hidden .partial- name: what a killed step leaves is litter to a later build, engine_dir.LITTER)
    tmp = listed.with_name(f".{listed.name}.partial-{os.getpid()}")
    try:
        tmp.write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(lines.items())))
        os.replace(tmp, listed)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def main(argv=None) -> int:
    from trtllm.runtime.interrupt import terminate_as_interrupt

    parser = argparse.ArgumentParser(prog="python -m trtllm.builder.plan", description=__doc__.splitlines()[0])
    parser.add_argument("engine_dir", type=Path)
    parser.add_argument("--timing-cache", help="TensorRT's timing cache file (reused across builds)")
    parser.add_argument("--workspace-gib", type=float, default=None, help="the builder's workspace (default: the build's)")
    parser.add_argument("--opt-level", type=int, default=None, help="TensorRT's builder optimization level 0-5")
    parser.add_argument("--sampling-plugin", action="store_true", help="the sampler as a TensorRT plugin")
    parser.add_argument("--no-verify", action="store_true", help="skip the check against the export's reference")
    args = parser.parse_args(argv)
    if args.opt_level is not None and not 0 <= args.opt_level <= 5:
        parser.error(f"--opt-level must be an integer in [0, 5], got {args.opt_level}")
    if args.timing_cache and Path(args.timing_cache).is_dir():  # (found before the build, not after it)
        parser.error(f"--timing-cache {args.timing_cache} is a directory; name a file in it")
    if args.workspace_gib is not None and not 0 < args.workspace_gib < float("inf"):
        parser.error(f"--workspace-gib must be > 0, got {args.workspace_gib}")
    try:
        with terminate_as_interrupt():  # (a timeout's SIGTERM: the staging directory goes as for Ctrl-C)
            manifest = mf.load(args.engine_dir, planning=True)
            given = manifest.build_config
            options = PlanOptions(graph=manifest.graph_profile, trt_version=given.get("trt_version", ""),
                                  sampling_plugin=args.sampling_plugin or bool(given.get("sampling_plugin")),
                                  workspace_gib=given.get("workspace_gib", 4.0) if args.workspace_gib is None
                                  else args.workspace_gib,
                                  opt_level=given.get("opt_level", 3) if args.opt_level is None else args.opt_level,
                                  timing_cache=args.timing_cache)
            plan_engine(args.engine_dir, options, verify=not args.no_verify)
    except KeyboardInterrupt:
        print("interrupted: the plan step stopped; the engine is as it was, or its plan pending: run it again",
              file=sys.stderr)
        return 130
    except (mf.ManifestError, trt_build.TensorRTUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ChecksumsNotUpdated as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the build or its check failed
        print(f"error: the plan was not built: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"plan written to {args.engine_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
