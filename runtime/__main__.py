from trtllm.runtime.cli import main

main()
