"""What a run streams per sample (trtllm-run --stream, trtllm-chat, trtllm-serve): after each
token, its new text, the ids generated since the sample's last line, and, where the request
reads them, its logprobs, its reasoning and content split (reasoning_parser), its tool calls as
they end and their deltas, and once it finishes vLLM's message fields.
"""
from __future__ import annotations

from trtllm.runtime import reasoning, tool_calls, tool_stream


class Streams:
    def __init__(self, runner, on_text):
        """`on_text(sample, text, finish_reason, token_ids[, fields])`: Runner.generate's callback."""
        self.runner, self.on_text = runner, on_text
        self.owner: dict[int, object] = {}  # id(row) -> its sample
        self.sent: dict[int, int] = {}  # ids handed out per row
        self.splits: dict[int, reasoning.Stream] = {}  # per row with a reasoning_parser
        self.calls: dict[int, tool_stream.Stream] = {}  # per row whose answer is read for tool calls

    def add(self, smp) -> None:
        """A sample whose row is made (runner.make_row)."""
        row, req = smp.row, smp.prepared.request
        self.owner[id(row)], self.sent[id(row)] = smp, 0
        # its text split as it comes (not a forced call's: no thought)
        if req.reasoning_parser and not tool_calls.forced(req.tool_choice):
            self.splits[id(row)] = reasoning.Stream(req.reasoning_parser, smp.prepared.thinking)
        # its answer (or its content, after the split) read for tool calls: the calls as they end
        if tool_calls.reads_calls(req.tool_choice, req.tool_call_parser, req.tools):
            self.calls[id(row)] = tool_stream.Stream(req.tool_choice, req.tool_call_parser, req.tools,
                                                     self.runner.calls_key(smp), req.parallel_tool_calls)

    def drop(self, smp) -> None:
        """Forget a sample that ended (trtllm-serve: its books would grow with every request)."""
        for books in (self.owner, self.sent, self.splits, self.calls):
            books.pop(id(smp.row), None)

    def on_token(self, row) -> None:
        if row.error is not None or id(row) not in self.owner:
            return
        chunk = row.text.take(final=row.finish_reason is not None)
        # a line for each new token, its text or not (held back: a possible stop string, a
        # character cut across tokens): its ids and logprobs are known now
        key = id(row)
        if not (chunk or row.finish_reason or len(row.output_ids) > self.sent[key]):
            return
        start, self.sent[key] = self.sent[key], len(row.output_ids)
        ids, smp = row.output_ids[start:], self.owner[key]
        fields = self.runner.streamed_logprobs(smp, start) if ids else {}
        final, said = row.finish_reason is not None, chunk
        if key in self.splits:
            thought, said = self.splits[key].push(chunk, final)
            fields.update({"reasoning_text": thought} if thought else {})
            if key in self.calls and self.splits[key].moved:  # (its content is no longer known)
                self.calls[key].stop()
        if key in self.calls:
            said, called = self.calls[key].push(said, final)
            fields.update({"new_tool_calls": called} if called else {})
            fields.update({"tool_call_deltas": deltas} if (deltas := self.calls[key].take_deltas()) else {})
        if said and (key in self.splits or key in self.calls):
            fields["content_text"] = said
        if row.finish_reason not in (None, "cancelled"):
            fields.update(self.runner.message_of(smp))
        self.on_text(smp, chunk, row.finish_reason, ids, *([fields] if fields else []))
