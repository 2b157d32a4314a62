"""Saved KV with an EAGLE draft head (runtime/speculative.py's SpecScheduler): the head has a KV
cache of its own, slot for slot beside the model's, which a restored prompt needs too. Its pair at
position p holds the token after p, so its KV of a prefix is one position shorter than the model's
and keyed by the tokens it depends on (`draft_key`: beside the model's entry, per adapter), and a
speculating row restores one position less than the model's KV would give: the last one is
computed again for its hidden state, which the head takes."""
from __future__ import annotations

import numpy as np

from trtllm.runtime.rows import RowState
from trtllm.runtime.step_inputs import MIN_COMPUTED, adapter_key, key_ids


def draft_key(row: RowState) -> str:
    """The prefix store's key for the draft's KV of a saved prefix (beside the base's, per adapter)."""
    return "eagle-draft" + ("" if row.adapter is None else ":" + row.adapter.digest)


class SpecContext:
    """--context-reuse for rows that speculate: a mixin of SpecScheduler, which sets `dkv` (the
    head's KV), `drafted` (an empty set) and `follows(row)` (the head runs over this row's text)."""

    drafted: set[int]  # id() of rows the head ran over from their prompt on
    caught: set[int]   # id() of those it caught up with to their last token (keeps_answer)

    def keeps_answer(self, row: RowState) -> bool:
        """Whether the head should run over a finishing row's last emitted tokens too: its answer's
        KV is kept, so the head's of it is worth keeping beside it."""
        return self.contexts is not None and row.context_commit == "including_generated_tokens"

    def restore_context(self, row: RowState) -> None:
        """The model's KV and the head's, as long as both hold the prompt (a speculating row kept
        its prompt's head KV), one position less than the model's."""
        if not self.follows(row):
            return super().restore_context(row)
        self.drafted.add(id(row))
        limit = len(row.prompt_ids) - MIN_COMPUTED
        if self.contexts is None or not row.context_lookup or limit <= row.num_reused + 1:
            return
        kv = self.contexts.lookup(key_ids(row), adapter_key(row), limit, self.kv.layout)
        if kv is None:
            return
        head = self.contexts.lookup(key_ids(row)[:kv.shape[2]], draft_key(row), kv.shape[2],
                                    lambda n: self.dkv.layout(n - 1), lag=1)
        n = 0 if head is None else min(kv.shape[2] - 1, head.shape[2])
        if n <= row.num_reused:
            self.contexts.hits -= 1  # (the model's entry was found, but nothing restores without the head's)
        else:
            self.kv.write(row.slot, kv[:, :, :n])
            self.dkv.write(row.slot, head[:, :, :n])
            self.contexts.reused_tokens += n - row.num_reused
            row.num_reused = n

    def finish_paused(self, slot: int, row: RowState, kept: tuple, out) -> float:
        """A row that finished in a plain step: where its answer's KV is kept, the head runs over the
        pairs it kept while paused and the last one, so its KV of the answer is whole (seconds)."""
        if not self.keeps_answer(row):
            return 0.0
        first, tokens, hidden = kept
        self.caught.add(id(row))
        pairs = np.stack([*hidden, out.hidden[slot, 0]])[None]
        return self.catch_up(slot, [row], [[*tokens, row.output_ids[-1]]], pairs, [first])

    def commit_context(self, slot: int, row: RowState) -> bool:
        """The head's KV is kept beside the model's: of the prompt and the answer where the head
        caught up with the row's last emitted tokens as it finished (in a verification), else of the
        prompt of a row it ran over. (A row that ended at its first token did not have the head run
        over its prompt's last chunk; one that ended in a plain step left pairs it never ran.)"""
        kept = super().commit_context(slot, row)
        if kept and id(row) in self.drafted and len(row.output_ids) > 1:
            answer = id(row) in self.caught and row.context_commit == "including_generated_tokens"
            tokens = (*key_ids(row), *row.output_ids) if answer else tuple(key_ids(row))
            self.contexts.commit(tokens, draft_key(row), lambda n: self.dkv.read(slot, n - 1))
        self.drafted.discard(id(row))
        self.caught.discard(id(row))
        return kept
