"""Running a snippet in a fresh process with a chosen CUDA allocator (simulated device).

PyTorch takes its CUDA allocator once per process, before CUDA starts, so comparing
torchmem with PyTorch's own allocator, or trying another way of installing torchmem,
needs a process per allocator. The snippet prints one JSON value on its last line;
``run`` returns it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# How each route makes its allocator PyTorch's, before the snippet runs.
ROUTES = {
    "native": "",
    "torchmem": "import torchmem\ntorchmem.install()\n",
    "cuda_allocator": (
        "import torchmem\n"
        "torch.cuda.memory.change_current_allocator(torchmem.cuda_allocator())\n"
    ),
    "pluggable": "from torchmem.runtime import cuda as _tm_cuda\n_tm_cuda.install_pluggable_allocator()\n",
}


def run(snippet: str, route: str, *, env: dict[str, str] | None = None,
        expect_failure: bool = False) -> object:
    """Runs ``snippet`` after installing ``route``'s allocator; returns its last line as JSON.

    With ``expect_failure`` the process must fail, and its stderr is returned instead.
    """
    code = "import json, sys, torch\n" + ROUTES[route] + textwrap.dedent(snippet)
    environment = dict(os.environ)  # keeps the simulated runtime's preload
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    environment.update(env or {})
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment,
                            capture_output=True, text=True, timeout=600)
    if expect_failure:
        assert result.returncode != 0, f"{route}: expected a failure\n{result.stdout}"
        return result.stderr
    assert result.returncode == 0, f"{route} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    lines = result.stdout.strip().splitlines()
    assert lines, f"{route}: the snippet printed nothing\n{result.stderr[-3000:]}"
    return json.loads(lines[-1])
