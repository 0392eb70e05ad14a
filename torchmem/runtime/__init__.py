"""torchmem inside PyTorch: installing it, the engine behind each device, tags, statistics."""
