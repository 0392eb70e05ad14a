"""The parts of ``benchmarks/run_all.py``: one command that measures torchmem against
PyTorch's own allocators and writes ``benchmarks/results/README.md``.

- ``common``: paths, goals, formatting and process helpers shared by every part;
- ``build``: the machine's description, building the tools, the children's environment,
  the trace files;
- ``measure``: running each benchmark (engine, CUDA end to end, CPU tensors,
  fragmentation, stack capture) into ``raw/``;
- ``report`` and its sections (``report_engine``, ``report_cuda``, ``report_cpu``,
  ``report_fragmentation``, ``report_stack``): turning ``raw/`` into the report;
- ``plots``: the report's figures (matplotlib, optional).

``--report-only`` runs only the reporting half, from the raw outputs of an earlier run.
"""
