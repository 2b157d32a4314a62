from trtllm.builder.cli import main

main()
