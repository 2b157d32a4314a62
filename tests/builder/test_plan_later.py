"""trtllm-build --plan-later and `python -m trtllm.builder.plan` (builder/plan.py), through the
TensorRT stand-ins (tests/fakes): the export needs no TensorRT and is checked through ONNX Runtime;
the plan step, with no checkpoint at hand, builds the plan, checks it against transformers' logits
recorded at the export and answers as an engine built in one go. Its wrong variant, a plan whose
logits are off, must fail the check and leave the engine as it was."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from tests import fakes
from trtllm.builder import plan
from trtllm.builder.config import BuildConfig, ConfigError
from trtllm.builder.export import build
from trtllm.builder.verify_logits import REFERENCE_NAME, VerifyError
from trtllm.runtime.engine import load_engine
from trtllm.runtime.manifest import ManifestError

pytestmark = pytest.mark.hf
LIMITS = dict(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)
PAYLOAD = {"max_generate_length": 8, "temperature": 0,
           "requests": [{"messages": [{"role": "user", "content": "hello there"}]},
                        {"messages": [{"role": "user", "content": "a second prompt"}], "temperature": 0.7, "seed": 2}]}


@pytest.fixture(scope="module")
def exported(tiny_checkpoint, tmp_path_factory):
    """(the export, an engine built in one go): legacy graph, TensorRT 10.3's lint."""
    root, ckpt = tmp_path_factory.mktemp("plan-later"), str(tiny_checkpoint("llama"))
    options = dict(model=ckpt, backend="tensorrt", graph="legacy", trt_version="10.3", **LIMITS)
    later = build(BuildConfig(output=str(root / "later"), plan_later=True, **options), log=lambda m: None)
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        whole = build(BuildConfig(output=str(root / "whole"), **options), log=lambda m: None)
    return later, whole


def copy_of(engine, tmp_path):
    import shutil

    return shutil.copytree(engine, tmp_path / "engine")


def test_the_export_needs_no_tensorrt_and_keeps_the_reference(exported):
    later, _ = exported
    m = json.loads((later / "manifest.json").read_text())
    assert m["backend"] == "tensorrt" and m["tensorrt"] == {"plan": "pending"} and not (later / "llm.plan").exists()
    report = json.loads((later / "verify.json").read_text())
    assert report["tokens_agree"] and report["top1_agreement"] >= report["min_agreement"]
    ref = np.load(later / REFERENCE_NAME)
    assert ref["logits"].shape[0] == len(ref["generated"]) and len(ref["text"]) == len(ref["text_argmax"])
    with pytest.raises(ManifestError, match=r"exported without its TensorRT plan .* python -m trtllm.builder.plan"):
        load_engine(later)


def test_the_plan_step_answers_as_a_build_in_one_go(exported, run_cli, tmp_path):
    later, whole = exported
    engine = copy_of(later, tmp_path)
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        assert plan.main([str(engine)]) == 0
        m = json.loads((engine / "manifest.json").read_text())
        assert m["tensorrt"]["version"] == "10.3.0.30" and (engine / "llm.plan").is_file()
        listed = (engine / "checksums.sha256").read_text()
        assert "llm.plan" in listed
        checks = json.loads((engine / "verify.json").read_text())
        assert checks["plan"]["tokens_agree"] and checks["plan"]["max_abs_error"] < 1e-3 and "top1_agreement" in checks
        result, out = run_cli(engine, PAYLOAD)
        assert result.exit_code == 0, result.output
        _, want = run_cli(whole, PAYLOAD)
    assert [r["output_ids"] for r in out["responses"]] == [r["output_ids"] for r in want["responses"]]
    assert not list(engine.glob(".plan.partial-*"))  # the staging directory is gone


def test_a_plan_off_from_the_reference_is_refused_and_changes_nothing(exported, tmp_path, monkeypatch):
    """The wrong variant: the plan's logits 0.01 off, every token the same (a float32 engine: held to
    transformers' logits within 1e-3)."""
    from trtllm.builder import verify_logits

    later, _ = exported
    engine = copy_of(later, tmp_path)
    before = (engine / "manifest.json").read_text()
    real = verify_logits.engine_logits

    def off(*args, **kwargs):
        chosen, logits = real(*args, **kwargs)
        return chosen, logits + np.float32(0.01) * (np.arange(logits.shape[-1]) % 2)

    monkeypatch.setattr(verify_logits, "engine_logits", off)
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        with pytest.raises(VerifyError, match=r"engine logits differ from transformers by up to 0\.01"):
            plan.plan_engine(engine, plan.PlanOptions(graph="legacy", trt_version="10.3"), log=lambda m: None)
        assert plan.main([str(engine)]) == 1
    assert (engine / "manifest.json").read_text() == before and not (engine / "llm.plan").exists()


def test_a_planned_engine_is_planned_again_whatever_its_plan_became(exported, tmp_path):
    """The plan deleted, or the swap interrupted after the plans (the manifest still pending): the
    runtime names the plan step, which takes the engine as it is (it refused it: the plan's size)."""
    later, _ = exported
    engine = copy_of(later, tmp_path)
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        assert plan.main([str(engine)]) == 0
        (engine / "llm.plan").write_bytes(b"half a plan")
        with pytest.raises(ManifestError, match="or only its plan: python -m trtllm.builder.plan"):
            load_engine(engine)
        assert plan.main([str(engine)]) == 0
        load_engine(engine).close()


def test_a_disk_full_at_the_checksums_says_the_plan_is_installed(exported, tmp_path, monkeypatch, capsys):
    """The last write (checksums.sha256) failing leaves the installed plan, the old list and no
    temporary file (a later build to the directory would refuse one it does not know)."""
    import errno
    import pathlib

    later, _ = exported
    engine = copy_of(later, tmp_path)
    before = (engine / "checksums.sha256").read_text()
    real = pathlib.Path.write_text

    def full(self, text, *args, **kwargs):
        if "checksums.sha256" in self.name:
            real(self, text[:10], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        assert plan.main([str(engine)]) == 1
        load_engine(engine).close()
    err = capsys.readouterr().err
    assert "the plan is built and installed, but" in err and "No space left on device" in err
    assert "was not built" not in err
    assert (engine / "checksums.sha256").read_text() == before
    assert sorted(p.name for p in engine.iterdir() if "checksums" in p.name) == ["checksums.sha256"]


def test_a_timing_cache_directory_is_refused_before_the_plan_is_built(exported, tmp_path, capsys):
    later, _ = exported
    with pytest.raises(SystemExit) as stop:
        plan.main([str(later), "--timing-cache", str(tmp_path)])
    assert stop.value.code == 2 and "is a directory" in capsys.readouterr().err


def test_a_damaged_copy_is_refused_by_the_file_not_listed_as_good(exported, tmp_path):
    later, _ = exported
    engine = copy_of(later, tmp_path)
    template = engine / "chat_template.jinja"
    template.write_text(template.read_text()[:10])  # an interrupted copy
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        with pytest.raises(ManifestError, match=r"chat_template.jinja is not the file the build wrote .* copy it again"):
            plan.plan_engine(engine, plan.PlanOptions(graph="legacy", trt_version="10.3"), log=lambda m: None)
    assert "chat_template.jinja" in (engine / "checksums.sha256").read_text()
    assert subprocess.run(["sha256sum", "-c", "--quiet", "checksums.sha256"], cwd=engine, capture_output=True).returncode


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_damaged_export_says_to_copy_or_export_it_again(exported, tmp_path, damage):
    """What the manifest check finds (a file of the wrong size, one missing) is mended by copying the
    export again or exporting it again with --plan-later, not by the plan step the TensorRT rebuild
    hint names (that is the command that just failed)."""
    later, _ = exported
    engine = copy_of(later, tmp_path)
    data = engine / "llm.onnx.data"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-100])
    else:
        (engine / "tokenizer.json").unlink()
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        with pytest.raises(ManifestError) as info:
            plan.plan_engine(engine, plan.PlanOptions(graph="legacy", trt_version="10.3"), log=lambda m: None)
    says = str(info.value)
    assert "copy the exported directory here again whole, or export it again" in says, says
    assert says.endswith("--plan-later") and ("--backend tensorrt" in says or "--profile" in says), says
    assert "python -m trtllm.builder.plan" not in says, says


def test_refusals(exported, tmp_path):
    later, _ = exported
    with pytest.raises(ConfigError, match="--plan-later exports a TensorRT engine: it needs --backend tensorrt"):
        BuildConfig(model="m", output="o", backend="onnxruntime", plan_later=True)
    with pytest.raises(ConfigError, match="--timing-cache is the plan step's"):
        BuildConfig(model="m", output="o", backend="tensorrt", plan_later=True, timing_cache="t.cache")
    engine = copy_of(later, tmp_path)
    (engine / REFERENCE_NAME).unlink()  # (as an export with --no-verify: no reference, nor its checksum)
    listed = engine / "checksums.sha256"
    listed.write_text("".join(ln + "\n" for ln in listed.read_text().splitlines() if REFERENCE_NAME not in ln))
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        assert plan.main([str(engine)]) == 2  # nothing to check against: --no-verify says so
        for bad in (["--opt-level", "9"], ["--workspace-gib", "0"]):
            with pytest.raises(SystemExit):
                plan.main([str(engine), *bad])
        assert plan.main([str(engine), "--no-verify"]) == 0
        assert json.loads((engine / "verify.json").read_text())["plan"] == "not verified"
    with pytest.raises(plan.trt_build.TensorRTUnavailable, match="the plan step needs TensorRT and a CUDA GPU: "
                                                                 "TensorRT is not installed; run it on the device"):
        plan.plan_engine(engine, plan.PlanOptions(graph="legacy", trt_version="10.3"), log=lambda m: None)
    assert plan.main([str(engine)]) == 2


def test_the_plan_step_imports_without_torch_or_transformers():
    code = ("import sys, trtllm.builder.plan, trtllm.builder.verify_logits; "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("version, profile", [("10.3.0.30", "tensorrt-legacy (jetson-orin-jp6 on JetPack 6)"),
                                              ("10.13.3.9", "jetson-thor-jp7 (JetPack 7.0/7.1)")])
def test_the_modern_graph_on_an_older_tensorrt_is_one_line(tiny_checkpoint, tmp_path, version, profile):
    """The profile it names is the device's: a Thor (TensorRT 10.13) was sent to the 8 GB Orin's."""
    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "modern"), backend="tensorrt",
                               plan_later=True, **LIMITS), log=lambda m: None)
    minor = ".".join(version.split(".")[:2])
    with fakes.installed(FAKE_TRT_VERSION=version):
        with pytest.raises(ManifestError, match=f"TensorRT {re.escape(minor)} cannot parse .* export it again with "
                                                f"--profile {re.escape(profile)}"):
            plan.plan_engine(engine, plan.PlanOptions(graph="modern", trt_version="11.1"), log=lambda m: None)


def test_bundled_adapters_are_checked_against_their_reference(tiny_checkpoint, tmp_path, monkeypatch):
    """The export keeps transformers' logits with each adapter merged; the plan step checks the plan
    with each adapter bound. Wrong variant: logits off only where an adapter is bound."""
    from tests.runtime.test_lora_cli import random_adapter
    from trtllm.builder import verify_logits
    from trtllm.runtime import manifest as mf

    ckpt = str(tiny_checkpoint("llama"))
    probe = build(BuildConfig(model=ckpt, output=str(tmp_path / "probe"), max_lora_rank=4, verify=False, **LIMITS),
                  log=lambda m: None)
    random_adapter(tmp_path / "math", mf.load(probe), 4, seed=3)
    engine = build(BuildConfig(model=ckpt, output=str(tmp_path / "lora"), backend="tensorrt", graph="legacy",
                               trt_version="10.3", plan_later=True, lora=(("math", str(tmp_path / "math")),), **LIMITS),
                   log=lambda m: None)
    assert "adapter/math/logits" in np.load(engine / REFERENCE_NAME).files
    options = plan.PlanOptions(graph="legacy", trt_version="10.3")
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        report = plan.plan_engine(engine, options, log=lambda m: None)
        assert report["adapters"]["math"]["max_abs_error"] < 1e-3 and report["adapters"]["math"]["tokens_agree"]
        real = verify_logits.engine_logits

        def off_with_an_adapter(*args, lora=None, **kwargs):
            chosen, logits = real(*args, lora=lora, **kwargs)
            return chosen, logits + np.float32(0.01) * (lora is not None) * (np.arange(logits.shape[-1]) % 2)

        monkeypatch.setattr(verify_logits, "engine_logits", off_with_an_adapter)
        with pytest.raises(VerifyError, match="with adapter math differ from transformers"):
            plan.plan_engine(engine, options, log=lambda m: None)


def test_a_16_bit_plan_is_held_near_the_exported_graph_s_own_error(tiny_checkpoint, tmp_path, monkeypatch):
    """float16's build check is top-1 agreement alone; the plan step also knows the exported graph's
    logit error and bounds the plan's by ten times it. Wrong variant: logits doubled, argmax kept."""
    from trtllm.builder import verify_logits

    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "half"), backend="tensorrt",
                               graph="legacy", trt_version="10.3", dtype="float16", plan_later=True, **LIMITS),
                   log=lambda m: None)
    options = plan.PlanOptions(graph="legacy", trt_version="10.3")
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        report = plan.plan_engine(engine, options, log=lambda m: None)
        assert report["max_abs_error"] <= report["error_bound"]
        real = verify_logits.engine_logits
        monkeypatch.setattr(verify_logits, "engine_logits",
                            lambda *a, **k: (lambda chosen, logits: (chosen, 2 * logits))(*real(*a, **k)))
        with pytest.raises(VerifyError, match="the plan's logits differ from transformers by up to .* past"):
            plan.plan_engine(engine, options, log=lambda m: None)


def test_an_eagle_engine_s_head_is_checked_against_its_reference(tiny_checkpoint, tmp_path, monkeypatch):
    """The export keeps the reference head's eagle_hidden, proposals and hidden states; the plan step
    checks both plans with them (it refused an EAGLE engine unless --no-verify). Wrong variant: the
    head's hidden state off in the plan."""
    from tests.eagle_drafts import random_draft
    from tests.tiny_models import make_checkpoint
    from trtllm.runtime.backends import tensorrt as trt_backend

    ckpt = make_checkpoint("llama", tmp_path / "m", num_layers=4)
    draft = random_draft(ckpt, tmp_path / "draft", seed=1)
    engine = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "eagle"), backend="tensorrt", graph="legacy",
                               trt_version="10.3", plan_later=True, eagle=str(draft), **LIMITS), log=lambda m: None)
    assert {"eagle/ids", "eagle/hidden", "eagle/draft_ids", "eagle/draft_hidden"} <= set(np.load(engine / REFERENCE_NAME).files)
    options = plan.PlanOptions(graph="legacy", trt_version="10.3")
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        report = plan.plan_engine(engine, options, log=lambda m: None)
        e = report["eagle"]
        assert e["proposals_agree"] and e["draft_max_abs_error"] < 1e-3 * max(1.0, e["draft_max_abs"])
        real = trt_backend.TensorRTDraftEngine.draft

        def off(self, *args, **kwargs):
            ids, hidden = real(self, *args, **kwargs)
            return ids, hidden + np.float32(0.5)

        monkeypatch.setattr(trt_backend.TensorRTDraftEngine, "draft", off)
        with pytest.raises(VerifyError, match="the EAGLE outputs differ from the reference head"):
            plan.plan_engine(engine, options, log=lambda m: None)
    ref = dict(np.load(engine / REFERENCE_NAME))
    with open(engine / REFERENCE_NAME, "wb") as f:  # an export from before: no head's reference
        np.savez(f, **{k: v for k, v in ref.items() if not k.startswith("eagle/")})
    plan.update_checksums(engine, [REFERENCE_NAME])
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        with pytest.raises(VerifyError, match="holds no reference for the EAGLE draft head"):
            plan.plan_engine(engine, options, log=lambda m: None)
