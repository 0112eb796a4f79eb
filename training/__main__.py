from trainfeed.training.cli import main

main()
