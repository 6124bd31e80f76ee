"""The layer contracts in pyproject.toml ([tool.importlinter]) hold, and they can fail.

import-linter reads a package from one folder; the source keeps `engine/` and `gateway/` at
the repository's top and links them into `inference_lab/` (so `lint-imports` also runs as it
is in a checkout). The test copies that layout into a temporary folder, where it can add a
forbidden import without touching the tree, and runs the real `lint-imports` over it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = 13


def _assemble(where: Path) -> Path:
    """A copy of the package as installed: `inference_lab/engine` and `inference_lab/gateway`
    are links to the fixed top-level folders, which the copy follows."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "inference_lab", where / "inference_lab", ignore=ignore)
    return where / "inference_lab"


def _lint(where: Path) -> subprocess.CompletedProcess:
    code = ("import sys; from importlinter.cli import lint_imports_command; "
            f"sys.argv = ['lint-imports', {str(ROOT / 'pyproject.toml')!r}]; "
            "sys.exit(lint_imports_command())")
    env = {**os.environ, "PYTHONPATH": str(where)}
    return subprocess.run([sys.executable, "-P", "-c", code], cwd=where, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_layer_contract_is_kept(tmp_path):
    _assemble(tmp_path)
    run = _lint(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in run.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("engine/sim/cost.py", "import asyncio", "import no event loop, RPC, HTTP or clock"),
    ("engine/sim/scheduler.py", "import time", "import no event loop, RPC, HTTP or clock"),
    ("gateway/app.py", "import inference_lab.engine.sim.core", "never import each other"),
    ("engine/sim/core.py", "import inference_lab.engine.drivers.pacer",
     "service over drivers over the simulation core"),
    ("common/toml.py", "import inference_lab.cli", "command line on top"),
    ("gateway/protocols/base.py", "import inference_lab.gateway.app",
     "the app over faults over the API dialects"),
    ("gateway/edge/fast.py", "import inference_lab.gateway.edge.connection",
     "its connection over its concerns"),
    ("experiments/runner.py", "import inference_lab.gateway.app", "over HTTP only"),
    ("conformance/checks.py", "import inference_lab.engine.sim.core", "over HTTP (and ZMQ) only"),
    ("conformance/probe.py", "import grpc", "over HTTP (and ZMQ) only"),
    ("engine/service/rpc.py", "import inference_lab.experiments.runner", "command line on top"),
    ("autoscale/hpa.py", "import asyncio", "Autoscalers are told the time"),
    ("engine/fleet/rules.py", "import asyncio", "run in virtual time too"),
    ("engine/metrics/updates.py", "import inference_lab.engine.drivers.pacer",
     "run in virtual time too"),
    ("autoscale/keda.py", "import inference_lab.experiments.runner", "command line on top"),
    ("engine/sim/offload/tier.py", "import inference_lab.engine.sim.offload.manager",
     "over the manager over a tier"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, contract):
    package = _assemble(tmp_path)
    target = package / module
    target.write_text(target.read_text() + f"\n{line}  # added by the test\n")
    run = _lint(tmp_path)
    assert run.returncode != 0
    report = " ".join(run.stdout.split())  # contract names wrap at 80 columns
    after = report[report.index(contract):]
    assert "BROKEN" in after and ("KEPT" not in after or after.find("BROKEN") < after.find("KEPT")), report
    assert line.split()[-1] in report  # the offending import is named
