"""EAGLE draft trees (trtllm-run --spec-draft-top-k K > 1): the head's K best candidates, expanded depth
by depth, and the likeliest of them verified together in one model step (runtime/speculative.py).

As EAGLE-2 builds them: the head's K best candidates for the first draft are the first depth; at
each further depth the K likeliest nodes of the last one are expanded together in one head run (each
sees the text and its own ancestors: a tree mask over the head's KV), and each gives its K best
children. A node's score is the sum of the head's log-probabilities along its path; the N - 1 best
nodes (with their ancestors, which score higher) are verified with the row's last token as the root:

    head run 1 expands depth 1 at slots p .. p+K-1 (position p), run 2 depth 2 at p+K .. p+2K-1
    (position p+1), ...; the model's step then writes the tree's nodes at slots p .. p+N-1, each at
    position p + its depth, seeing its ancestors (`tree_mask`).

The model's token at each node (the sampler's, drawn with the row's random number for the node's
depth + 1st token; greedy: the argmax) is what plain decoding would emit after the node's path, so
walking from the root to the child that holds the model's token, while there is one, emits exactly
plain decoding's tokens. The accepted path's KV then moves to the slots after the root.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime import spec_rules
from trtllm.runtime.generate import write_position


@dataclass
class DraftTree:
    """One row's tree, nodes in topological order: node 0 is the row's last token (the root), every
    other one a drafted token whose parent is an earlier node."""

    tokens: list[int]
    parents: list[int]
    ranks: list[int] = field(default_factory=list)  # each node's place among its parent's candidates (0: best)
    depths: list[int] = field(init=False)

    def __post_init__(self):
        self.depths = [0]
        for parent in self.parents[1:]:
            assert 0 <= parent < len(self.depths), "a node's parent comes before it"
            self.depths.append(self.depths[parent] + 1)

    def __len__(self) -> int:
        return len(self.tokens)

    def mask(self, width: int) -> np.ndarray:
        """bool [width, width]: node i sees itself and its ancestors (padding: itself)."""
        out = np.eye(width, dtype=np.bool_)
        for i in range(1, len(self)):
            out[i] |= out[self.parents[i]]
        return out

    def children(self, node: int) -> list[int]:
        return [i for i in range(node + 1, len(self)) if self.parents[i] == node]

    def walk(self, greedy: list[int]) -> tuple[list[int], list[int]]:
        """From the root, while a child holds the model's token at its parent: (the accepted
        nodes, the tokens to emit: theirs and the model's token after the last)."""
        path, node = [], 0
        while True:
            nxt = next((c for c in self.children(node) if self.tokens[c] == greedy[node]), None)
            if nxt is None:
                return path, [self.tokens[n] for n in path] + [greedy[node]]
            path.append(nxt)
            node = nxt

    def tested(self, path: list[int]) -> int:
        """How many depths the verification tested: the accepted ones, and the next if drafted."""
        return len(path) + bool(self.children(path[-1] if path else 0))


@dataclass
class Candidate:
    token: int
    parent: int          # index into the row's candidates; -1: the root
    score: float         # sum of the head's log-probabilities along the path
    depth: int
    hidden: np.ndarray   # the head's hidden state that goes in with this token when it is expanded
    rank: int = 0        # its place among its parent's candidates (0: the head's best)
    slot: int = -1       # its expansion's KV slot in the tree's region (-1: not expanded)


def select(cands: list[Candidate], root_token: int, size: int) -> DraftTree:
    """The `size` - 1 best candidates whose ancestors are in too, as a tree (by depth, then score)."""
    order = sorted(range(len(cands)), key=lambda i: (-cands[i].score, cands[i].depth))
    chosen: set[int] = set()
    for i in order:
        if len(chosen) >= size - 1:
            break
        if cands[i].parent < 0 or cands[i].parent in chosen:
            chosen.add(i)
    nodes = sorted(chosen, key=lambda i: (cands[i].depth, -cands[i].score, i))
    index = {c: n + 1 for n, c in enumerate(nodes)}
    return DraftTree([root_token] + [cands[i].token for i in nodes],
                     [-1] + [0 if cands[i].parent < 0 else index[cands[i].parent] for i in nodes],
                     [0] + [cands[i].rank for i in nodes])


def expansion_mask(cands: list[Candidate], frontier: list[int], start: int, width: int) -> np.ndarray:
    """bool [width, start + width] for one row's head run over `frontier`, written at slots start ..
    start + width - 1 of the tree's region (from the first expansion's slot): each node sees the
    slots its expanded ancestors were written at and its own (padding: its own)."""
    out = np.zeros((width, start + width), np.bool_)
    for row in range(width):
        out[row, start + row] = True
        a = cands[frontier[row]].parent if row < len(frontier) else -1
        while a >= 0:
            out[row, cands[a].slot] = True
            a = cands[a].parent
    return out


def children(parent: int, score: float, depth: int, hidden, ids, lps, width: int, guess=None) -> list[Candidate]:
    """A node's `width` best children (the head's ids and log-probabilities, best first). A row's
    `guess` at the token its sampler will draw there, if any, is among them and comes first, scored
    as certain (its parent's score): the tree then holds the guessed path whole, and the head's
    other candidates where they score next."""
    out = [Candidate(int(t), parent, score + float(lp), depth, hidden, r)
           for r, (t, lp) in enumerate(zip(ids[:width], lps[:width]))]
    if guess is not None:
        rank = next((r for r, t in enumerate(ids) if int(t) == guess), len(ids))
        out = [Candidate(guess, parent, score, depth, hidden, rank)] + [c for c in out if c.token != guess][: width - 1]
    return out


def grow(run_head, roots: dict[int, tuple[int, np.ndarray, np.ndarray, np.ndarray]], batch: int, width: int,
         depth: int, size: dict[int, int], guess=None) -> dict[int, DraftTree]:
    """Each row's tree: `roots[s]` = (its last token, the head's hidden state for its first
    candidates, their ids and log-probabilities, best first), `width` candidates per node,
    `depth` levels (depth - 1 head runs), at most size[s] nodes with the root.
    run_head(ids, hidden, level, write_offset, mask) runs the head over ids/hidden [batch, S(, H)],
    nodes of depth `level` (their pairs at the root's position + level - 1), for every row at its
    tree region's slots write_offset .. (mask [batch, S, write_offset + S]) and gives
    (ids, log-probabilities [batch, S, width] of each node's best children, hidden [batch, S, H]).
    guess(s, depth, ids, lps): row s's guess at its sampler's draw at that depth from a node's
    candidates, or None (see `children`)."""
    guess = guess or (lambda s, d, ids, lps: None)
    cands = {s: children(-1, 0.0, 1, h, ids, lps, width, guess(s, 1, ids, lps)) for s, (_, h, ids, lps) in roots.items()}
    frontier = {s: list(range(len(c))) for s, c in cands.items()}
    offset, size_h = 0, next(iter(roots.values()))[1].shape[-1]
    for level in range(1, depth):
        runs = {s: f for s, f in frontier.items() if f}
        if not runs:
            break
        n = max(len(f) for f in runs.values())
        ids = np.zeros((batch, n), np.int64)
        hidden = np.zeros((batch, n, size_h), np.float32)
        mask = np.zeros((batch, n, offset + n), np.bool_)
        mask[:, np.arange(n), offset + np.arange(n)] = True  # the rows not growing: each token itself
        for s, f in runs.items():
            for j, i in enumerate(f):
                ids[s, j], hidden[s, j], cands[s][i].slot = cands[s][i].token, cands[s][i].hidden, offset + j
            mask[s] = expansion_mask(cands[s], f, offset, n)
        top_ids, top_lps, out_hidden = run_head(ids, hidden, level, offset, mask)
        offset += n
        for s, f in runs.items():
            new = []
            for j, i in enumerate(f):
                best, lps = top_ids[s, j], top_lps[s, j]
                for c in children(i, cands[s][i].score, level + 1, out_hidden[s, j], best, lps, width,
                                  guess(s, level + 1, best, lps)):
                    new.append(len(cands[s]))
                    cands[s].append(c)
            frontier[s] = sorted(new, key=lambda c: -cands[s][c].score)[:width]
    return {s: select(cands[s], roots[s][0], size[s]) for s in roots}


class TreeDecoding:
    """SpecScheduler's decode cycle with draft trees (--spec-draft-top-k > 1); it uses the
    scheduler's state (ready, kv, the head) and its cycle helpers (runtime/speculative.py)."""

    def decode_tree(self, hi: int, rows: list, k: int, elapsed: float) -> None:
        """Draft a tree of depth k for every speculating row, verify all of them in one step."""
        pos = [write_position(r) for r in rows]
        k_top = self.top_k
        self.ensure(max(pos) + 1 + max(self.tree_nodes(k), (k - 1) * k_top))
        # the step's tokens and the head's expansions stay inside every slot and the engine's inputs
        room = min(self.engine.manifest.limits.max_input_len, min(self.kv.capacity - p for p in pos))
        left = {s: spec_rules.room(r) for s, r in enumerate(rows) if s in self.ready and self.speculates(r)}
        depth = min(k, 1 + (room - 1) // k_top, max(left.values(), default=0))
        nodes = min(self.tree_nodes(depth), room - 1) if depth > 0 else 0
        depth = min(depth, nodes)  # (a tree of n nodes is at most n deep: no expansion it cannot use)
        spec = [s for s, n in left.items() if n > 0]
        self.timing.draft_steps[depth if spec and nodes else 0] = self.timing.draft_steps.get(
            depth if spec and nodes else 0, 0) + 1
        if not spec or nodes < 1:  # nothing to verify (each row at its last token, or no room): a plain step
            self.timing.generation_seconds += elapsed
            return self.paused(hi, rows)
        roots = {s: ((rows[s].output_ids or rows[s].prompt_ids)[-1], *self.ready[s][1:]) for s in spec}
        runs = [0, 0.0]

        def run_head(ids, hidden, level, offset, mask):
            n = ids.shape[1]
            p = np.array(pos, np.int64)
            d, h, best, t = self.draft_step(0, ids, hidden, np.tile(p[:, None] + level - 1, (1, n)),
                                            np.full(hi, n - 1, np.int64), top=True, write_index=p + offset,
                                            nodes=np.tile(np.arange(n, dtype=np.int64), (hi, 1)), tree_mask=mask)
            runs[0], runs[1] = runs[0] + 1, runs[1] + t
            return best[0][:, 1:], best[1][:, 1:], best[2]

        numbers = {s: rows[s].peek(depth) for s in spec if self.guessing(rows[s])}

        def guess(s, d, ids, lps):  # a node of depth d's token is drawn with the row's d-th next number
            return self.guess(rows[s], ids, lps, numbers[s][d - 1]) if s in numbers else None

        trees = grow(run_head, roots, hi, k_top, depth, {s: nodes + 1 for s in spec}, guess)
        w = 1 + max(len(t) - 1 for t in trees.values())
        ids = np.full((hi, w), self.pad, np.int64)
        start = np.array(pos, np.int64)
        positions = start[:, None] + np.arange(w)
        mask = np.tile(np.eye(w, dtype=np.bool_), (hi, 1, 1))
        last = np.zeros(hi, np.int64)
        for s, r in enumerate(rows):
            if s in trees:
                t = trees[s]
                ids[s, : len(t)], positions[s, : len(t)] = t.tokens, start[s] + np.array(t.depths)
                mask[s], last[s] = t.mask(w), len(t) - 1
            elif r is not None and not r.prefilling:
                ids[s, 0] = (r.output_ids or r.prompt_ids)[-1]
        depths = {s: trees[s].depths if s in trees else [0] for s, r in enumerate(rows) if self.speculates(r)}
        out, step_time, drawn = self.verify_step(ids, positions, start, last, mask, depths)
        emitted: list[list[int] | None] = [None] * hi
        for s, r in enumerate(rows):
            if self.plain_or_failed(s, r, out):
                continue
            if s not in trees:  # it speculates but drafts nothing this cycle: its token from the root
                emitted[s] = self.emit(s, r, [int(out.verify_ids[s, 0])], out, [0])
                continue
            t = trees[s]
            path, emitted[s] = self.verify_tree(s, r, t, [int(v) for v in out.verify_ids[s, : len(t)]], out,
                                                drawn.get(s))
            for i, node in enumerate(path):  # the accepted nodes' KV and hidden states follow the root
                if node != i + 1:
                    self.kv.move_position(s, pos[s] + node, pos[s] + i + 1)
                    out.hidden[s, i + 1] = out.hidden[s, node]
            self.timing.drafted_tokens += len(t) - 1
            self.timing.accepted_tokens += len(emitted[s]) - 1
            self.timing.branch_tokens += sum(t.ranks[n] > 0 for n in path[: len(emitted[s]) - 1])
            if self.policy is not None:
                self.policy.record_row(t.tested(path), len(emitted[s]) - 1)
        self.finish_cycle(hi, rows, emitted, drawn, out, pos, w, step_time, elapsed, runs[1], runs[0])

    def verify_tree(self, slot: int, row, tree: DraftTree, greedy: list[int], out,
                    numbers: list | None = None) -> tuple[list[int], list[int]]:
        """The accepted path and what was emitted (the path's tokens and the model's next, up to the
        row's end: each drawn at its parent node, the root's at the root; `numbers`: a sampled row's
        by depth)."""
        if self.walked(row):
            return self.walk(slot, row, lambda node, token: next(
                (c for c in tree.children(node) if tree.tokens[c] == token), None), greedy[0], out, numbers,
                lambda node: tree.depths[node])
        path, tokens = tree.walk(greedy)
        return path, self.emit(slot, row, tokens, out, [0] + path)
