"""One module per `python -m launch` subcommand, each with its own arguments and handler."""
