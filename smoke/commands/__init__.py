"""The subcommands of `python -m smoke`, one module each."""
