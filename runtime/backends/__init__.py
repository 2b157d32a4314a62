"""trtllm-edge."""
