import numpy as np
from tests.parity.test_eagle_overflow import *  # noqa
from tests.parity.test_eagle_overflow import overflowing, PARAMS  # noqa
from trtllm.runtime import speculative


def test_dbg(overflowing, monkeypatch):
    engine_dir, prompts, bad = overflowing
    print("BAD", bad)
    real_emit = SpecScheduler.emit
    def emit(self, slot, row, tokens, out, sources):
        r = real_emit(self, slot, row, tokens, out, sources)
        if row.finish_reason == "error":
            vl = out.verify_logits
            print("ERR slot", slot, "tokens", tokens, "sources", list(sources), "emitted", r,
                  "finite per pos", [bool(np.isfinite(vl[slot, j].max())) for j in range(vl.shape[1])])
        return r
    monkeypatch.setattr(SpecScheduler, "emit", emit)
    from trtllm.runtime import draft_tree
    real_t = SpecScheduler.verify_tree
    def vt(self, slot, row, tree, greedy, out, *rest):
        vl = out.verify_logits
        fin = [bool(np.isfinite(vl[slot, j].max())) for j in range(len(tree))]
        if not all(fin): print("TREE slot", slot, "tokens", tree.tokens, "depths", tree.depths, "finite", fin)
        return real_t(self, slot, row, tree, greedy, out, *rest)
    monkeypatch.setattr(SpecScheduler, "verify_tree", vt)
    real_v = SpecScheduler.verify
    def verify(self, slot, row, ids, drafts, out, *rest):
        if slot == 2: print("VERIFY", len(row.output_ids), "ids", ids, "drafts", drafts)
        return real_v(self, slot, row, ids, drafts, out, *rest)
    monkeypatch.setattr(SpecScheduler, "verify", verify)
    _, _, rows = generate(engine_dir, prompts, 3, 3, params=[PARAMS[0]] * len(prompts), rows_out=True)
    print([(len(r.output_ids), r.finish_reason) for r in rows])
