"""trtllm::Sample: in-graph sampling (logit bias, penalties, temperature, min_p, top-k, top-p, greedy, top-K logprobs).

schema.py (plain data) and reference.py (numpy) import without onnx, so the runtime can use them;
body.py builds the ONNX function and needs onnx. Nothing is imported here, so importing this
package stays cheap: import the module you need.
"""
