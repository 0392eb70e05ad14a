"""Reports on the cache: the readable summary and snapshots in PyTorch's format."""
