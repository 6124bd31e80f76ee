"""The wheel installs one import namespace, `inference_lab`, and the installed command works
from any directory, the repository's root included (where a bare `python -m` would find the
source folder `inference_lab/` first: the project spawns its children with `-P`)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project's wheel, built and unpacked into a folder of its own (no dependencies)."""
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(where), str(ROOT)], check=True, capture_output=True, timeout=240)
    wheel = next(where.glob("inference_lab-*.whl"))
    target = where / "site"
    zipfile.ZipFile(wheel).extractall(target)
    return target


def _run(site: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-P", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_wheel_has_one_top_level_package(installed):
    top = next(installed.glob("inference_lab-*.dist-info")) / "top_level.txt"
    if top.exists():
        assert top.read_text().split() == ["inference_lab"]
    tops = sorted(p.name for p in installed.iterdir() if not p.name.endswith(".dist-info"))
    assert tops == ["inference_lab"]


def test_generic_names_are_not_installed(installed):
    run = _run(installed, "-c", "import engine", cwd=installed)
    assert run.returncode != 0 and "No module named 'engine'" in run.stderr
    run = _run(installed, "-c", "import gateway", cwd=installed)
    assert run.returncode != 0 and "No module named 'gateway'" in run.stderr


@pytest.mark.parametrize("cwd", ["root", "elsewhere"])
def test_the_installed_command_runs_from_any_directory(installed, tmp_path, cwd):
    where = ROOT if cwd == "root" else tmp_path
    code = ("import inference_lab.engine.sim.core as c, inference_lab.gateway.app as g; "
            "print(c.__file__); print(g.__file__)")
    run = _run(installed, "-c", code, cwd=where)
    assert run.returncode == 0, run.stderr
    assert all(line.startswith(str(installed)) for line in run.stdout.split())
    for sub in ("serve", "engine", "gateway", "sim"):
        run = _run(installed, "-m", "inference_lab", sub, "--help", cwd=where)
        assert run.returncode == 0, run.stderr
        assert f"inference-lab {sub}" in run.stdout


def test_the_bundled_presets_fit_runs_from_the_wheel_on_the_measurements_it_ships(installed, tmp_path):
    shipped = sorted(p.name for p in (installed / "inference_lab" / "calibrate" / "data").glob("*.toml"))
    assert shipped == sorted(p.name for p in (ROOT / "inference_lab" / "calibrate" / "data").glob("*.toml"))
    code = ("from inference_lab.calibrate import fit_presets; "
            "print(fit_presets.DATA); print(len(fit_presets.load_rows()))")
    run = _run(installed, "-c", code, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    data, rows = run.stdout.split()
    assert data.startswith(str(installed)) and int(rows) > 0
