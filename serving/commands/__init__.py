"""The subcommands of `python -m serving`, one module each."""
