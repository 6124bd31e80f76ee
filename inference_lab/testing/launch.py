"""The real commands (`serve`, `engine`, `gateway`) as processes on free loopback ports,
for tests and benchmarks alike.

Every child is spawned as `python -P -m inference_lab ...` (README: with the current
directory off sys.path, the installed package is what runs, from any folder).
"""

from __future__ import annotations

import sys


def command(*args: str) -> list[str]:
    """argv of `inference-lab ARGS` run by this interpreter."""
    return [sys.executable, "-P", "-m", "inference_lab", *args]
