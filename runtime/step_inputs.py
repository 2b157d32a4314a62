"""A step's inputs for the rows it runs (prefill: right-padded prompts; decode: each row's last
token), and the KV sizes a run's rows need: pure functions of the rows (runtime/generate.py runs them).
Also the saved KV a prompt starts from, restored into its slot (plain rows and beam searches alike)."""
from __future__ import annotations

import numpy as np

from trtllm.runtime import sampling
from trtllm.runtime.engine import StepInputs
from trtllm.runtime.rows import RowState

CAPACITY_ROUNDING = 64  # KV capacities are multiples of this many positions
# The KV buffers start at the longest prompt plus this many positions and double as generation
# needs more (up to what the longest request may need): a run allowed 4,096 new tokens per request
# that stops after 100 no longer holds slots x 4,096 positions (numpy backs them with 2 MiB pages,
# which makes all of them resident).
GENERATION_HEADROOM = 256


def adapter_key(owner) -> str | None:
    """Its LoRA adapter's digest in the saved KV's keys (a row's, a beam search's: its `adapter`):
    what a saved system prompt is keyed by (it never holds an image: media.py)."""
    return None if owner.adapter is None else owner.adapter.digest


def key_ids(row: RowState) -> list[int]:
    """Its prompt's ids as KV of a prompt is keyed by them (context reuse, rows sharing a prompt):
    an image's tokens are one id whatever the image, so there they are an id of the image's own
    (runtime/media.py PromptImages.keyed): a prompt with another image shares its KV up to that image."""
    return row.prompt_ids if row.images is None else row.images.keyed


def kv_need(row: RowState) -> int:
    """KV positions a row fills: its prompt and every generated token but the last, which is
    never fed back (so a prompt that fills the capacity still gets one token)."""
    return len(row.prompt_ids) + max(row.max_new_tokens - 1, 0)


def runs_to_length(row: RowState) -> bool:
    """Whether a row generates its max_new_tokens whatever it draws: no EOS it heeds (ignore_eos), no
    stop id or stop string, no grammar that can end it."""
    return not row.banned and row.guide is None and (row.text is None or not row.text.stops)


def rounded(positions: int) -> int:
    return -(-positions // CAPACITY_ROUNDING) * CAPACITY_ROUNDING


def capacity_for(rows: list[RowState], max_capacity: int) -> int:
    """The most KV positions a slot of this run can need."""
    return min(max_capacity, rounded(max(kv_need(r) for r in rows)))


# Prompt tokens a row computes itself when the rest of its prompt's KV is copied in (from a saved
# prefix or a neighbour): the first logits need one, and ONNX Runtime's GroupQueryAttention takes a
# one-token step for a decode step, whose arithmetic differs in the last bits from a prompt's (our
# attention kernel does not).
MIN_COMPUTED = 2


def restore_prefix_kv(prefixes, kv, slot: int, prompt_ids, prefix_ids, adapter: str | None) -> int:
    """A saved system prompt's KV into `slot`, MIN_COMPUTED prompt tokens left to compute: the
    positions it holds then (0: none saved, or too short a prompt)."""
    if not (prefixes and prefix_ids):
        return 0
    saved = prefixes.load(prefix_ids, adapter, kv.layout(len(prefix_ids)))
    if saved is not None and (n := min(saved.shape[2], len(prompt_ids) - MIN_COMPUTED)) > 0:
        kv.write(slot, saved[:, :, :n])
        return n
    return 0


def restore_context_kv(contexts, kv, slot: int, prompt_ids, adapter: str | None, reused: int) -> int:
    """--context-reuse: the longest prefix of the prompt that an earlier request's KV holds, into
    `slot` where it is longer than the `reused` positions it holds (a saved system prompt's),
    MIN_COMPUTED tokens left to compute: the positions it holds then."""
    limit = len(prompt_ids) - MIN_COMPUTED
    if contexts is None or limit <= reused:
        return reused
    saved = contexts.lookup(prompt_ids, adapter, limit, kv.layout)
    if saved is None:
        return reused
    if saved.shape[2] <= reused:  # (found, but no longer than the saved system prompt: nothing restored)
        contexts.hits -= 1
        return reused
    kv.write(slot, saved)
    contexts.reused_tokens += saved.shape[2] - reused
    return saved.shape[2]


# A Mamba-2 layer's step costs tokens x tokens a head (builder/mamba.py: its scan over the step's tokens
# at once, as attention's scores): prompts on such engines go in steps of at most this many tokens
# (transformers' mamba_chunk_size): 16 MiB of float32 a row per tokens x tokens tensor at 64 heads.
RECURRENT_CHUNK = 256

PAD_WASTE = 1.25  # a prefill step may compute at most this much more than its rows' real tokens


def by_width(widths: list[int], start: int) -> list[tuple[int, int]]:
    """Contiguous slots [start, start + len(widths)) -> [start, stop) steps in which right-padding
    to the widest row costs at most PAD_WASTE x the real tokens: one 4000-token prompt admitted with
    fifteen 20-token ones would make every row compute 4000 (4.5x the work, and every row's first
    token waits for it). A prompt's logits do not depend on what shares its step."""
    out: list[tuple[int, int]] = []
    lo, widest, real = start, 0, 0
    for s, w in enumerate(widths, start):
        if s > lo and (s + 1 - lo) * max(widest, w) > PAD_WASTE * (real + w):
            out.append((lo, s))
            lo, widest, real = s, 0, 0
        widest, real = max(widest, w), real + w
    out.append((lo, start + len(widths)))
    return out


def runs(slots: list[int]) -> list[tuple[int, int]]:
    """Sorted slots -> maximal contiguous [start, stop) ranges: each is one step's batch."""
    out: list[tuple[int, int]] = []
    for s in sorted(slots):
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], s + 1)
        else:
            out.append((s, s + 1))
    return out


def chunk_end(row: RowState, chunk: int) -> int:
    """Where a prefill step stops in a row's prompt: `chunk_stop` from what its KV holds."""
    return chunk_stop(len(row.prompt_ids), row.computed, chunk, row.images)


def chunk_stop(n: int, start: int, chunk: int, images=None) -> int:
    """Where a prefill step from `start` stops in a prompt of n tokens: `chunk` tokens on (0: at its
    end), but never short of the end by less than MIN_COMPUTED: a last chunk of one token would take
    ONNX Runtime's one-token (decode) attention, whose low bits differ from a prompt's. An image whose
    tokens see each other both ways (`images`, the prompt's PromptImages: Gemma 3's) is never cut."""
    end = start + chunk
    if chunk > 0 and images is not None:
        end = images.stop(start, end, MIN_COMPUTED)  # (no one-token step before an image either)
    return n if chunk <= 0 or n - end < MIN_COMPUTED else end


def prefill_inputs(rows: list[RowState], pad_id: int, batch: sampling.SamplingBatch,
                   ends: list[int] | None = None) -> StepInputs:
    """Each row's prompt from its first position not in its KV (`computed`) to `ends` (default:
    the prompt's end), right-padded; it writes from that position."""
    starts = [r.computed for r in rows]
    rests = [r.prompt_ids[r.computed:end] for r, end in zip(rows, ends or [None] * len(rows))]
    width = max(len(t) for t in rests)
    ids = np.full((len(rows), width), pad_id, np.int64)
    for b, t in enumerate(rests):
        ids[b, : len(t)] = t
    positions = np.array(starts, np.int64)[:, None] + np.arange(width, dtype=np.int64)[None, :]
    return StepInputs(input_ids=ids, position_ids=positions, write_index=np.array(starts, np.int64), prompt=True,
                      last_index=np.array([len(t) - 1 for t in rests], np.int64), sampling=batch,
                      **image_inputs([(b, r.images, r.computed, r.computed + len(t))
                                      for b, (r, t) in enumerate(zip(rows, rests))]))


def image_inputs(spans: list[tuple[int, object, int, int]]) -> dict:
    """A prompt step's image inputs: for each (row, its PromptImages or None, start, end) of prompt
    positions the step computes, the image tokens' embeddings (and, images seen both ways, their look-ahead)
    and, multimodal RoPE, the tokens whose three positions are not their slot's (an image's, and the text
    after it); {} where there are none."""
    windows = [w for b, images, start, end in spans
               if images is not None and (w := images.window(b, start, end)) is not None]
    aheads = [a for b, images, start, end in spans
              if images is not None and (a := images.ahead(start, end)) is not None]
    turns = [w for b, images, start, end in spans
             if images is not None and (w := images.rope_window(b, start, end)) is not None]
    return {**({"image_index": np.concatenate([w[0] for w in windows]),
                "image_embeds": np.concatenate([w[1] for w in windows])} if windows else {}),
            **({"image_ahead": np.concatenate(aheads)} if aheads else {}),
            **({"rope_index": np.concatenate([w[0] for w in turns]),
                "rope_positions": np.concatenate([w[1] for w in turns])} if turns else {})}


def rope_deltas(rows: list[RowState | None]) -> np.ndarray | None:
    """Multimodal RoPE: each row's shift from a slot past its prompt to that token's rotary position
    (negative: an image of h x w tokens spans max(h, w) positions); None where every row's is 0. A
    row with no token yet (parked: its pad is overwritten before it is read) takes none, which could
    put its pad before position 0."""
    deltas = [0 if r is None or r.images is None or not r.output_ids else r.images.rope_delta for r in rows]
    return np.array(deltas, np.int64) if any(deltas) else None


def guess_ids(rows: list[RowState | None], guesses: dict[int, list[int]], width: int, pad_id: int) -> np.ndarray:
    """[len(rows), width] input ids of a step that checks guessed tokens (EAGLE's drafts, prompt
    lookup's): each generating row's last token, then its guesses (slot -> ids); pads elsewhere (idle
    and parked slots, and past a row's guesses)."""
    ids = np.full((len(rows), width), pad_id, np.int64)
    for s, r in enumerate(rows):
        if r is not None and not r.prefilling:
            ids[s, 0] = (r.output_ids or r.prompt_ids)[-1]
            ids[s, 1: 1 + len(guesses.get(s, ()))] = guesses.get(s, ())
    return ids


def write_position(row: RowState | None) -> int:
    """Where a decode step writes a row's token: after its last one; for a row without a token
    yet (parked: its prompt is still being prefilled or copied), where its next chunk or copy
    writes, which overwrites it before anything reads it; for an idle slot (None), 0."""
    if row is None or not row.output_ids:
        return 0 if row is None else row.computed
    return len(row.prompt_ids) + len(row.output_ids) - 1


def decode_inputs(rows: list[RowState | None], pad_id: int, batch: sampling.SamplingBatch,
                  reuse: StepInputs | None = None, recurrent: bool = False) -> StepInputs:
    """Each active row feeds its last token at its next position; an idle or parked slot feeds a
    pad at its write_position. With `reuse` (an earlier result for the same rows and batch), its
    arrays are overwritten in place: a backend that bound them once (ONNX Runtime's IOBinding) has
    nothing to bind again. `recurrent` (an engine with model.state_shapes): an idle or parked slot's
    last_index is -1, so that its pad does not enter its recurrent state (builder/mamba.py)."""
    last = [pad_id if r is None or not r.output_ids else r.output_ids[-1] for r in rows]
    pos = [write_position(r) for r in rows]
    taken = [-1 if recurrent and (r is None or not r.output_ids) else 0 for r in rows]
    delta = rope_deltas(rows)
    if reuse is not None and (reuse.rope_delta is None) == (delta is None):
        reuse.input_ids[:, 0] = last
        reuse.position_ids[:, 0] = pos
        reuse.write_index[:] = pos
        reuse.last_index[:] = taken
        if delta is not None:
            reuse.rope_delta[:] = delta
        return reuse
    return StepInputs(input_ids=np.array(last, np.int64)[:, None], position_ids=np.array(pos, np.int64)[:, None],
                      write_index=np.array(pos, np.int64), last_index=np.array(taken, np.int64),
                      sampling=batch, rope_delta=delta)
