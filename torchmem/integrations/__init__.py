"""torchmem where users meet it: the pytest plugin, ``python -m torchmem`` and DataLoader workers."""
