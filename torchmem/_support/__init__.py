"""Helpers every part of torchmem uses; nothing here imports the rest of torchmem."""
