from trainfeed.converters.cli import main

main()
