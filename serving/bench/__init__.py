"""The qualification bench: its cells (what is measured), the timed streams (on the kit's one
HTTP client library), the sessions (options, resumable receipts), the receipts and their plots."""
