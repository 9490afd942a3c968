"""Figures vLLM 0.34.0's engine core computes on the CPU that more than one test holds the kit's
image to (the planner tests compute them; the e2e checks the CUDA image gives the same)."""

SM120_BLOCKS_AT_12_GIB = 905
"""dflash-tp4-dcp4's pool at 12 GiB with vLLM 0.34.0's SM120 sparse-MLA latent: its 528-byte
rows with the pool stride aligned to 64 of them, one C4 unit more per block than the runtime's
B12X backend (seed 000's 906)."""
