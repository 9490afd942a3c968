"""The qualification bench: its cells (what is measured), the raw HTTP client that times
streams, the sessions (options, resumable receipts), the receipts and their plots."""
