"""Host memory beyond torchmem's blocks: resident set size per process."""
