from pipelines.replay.cli import main

main()
