"""pyproject.toml's lowest versions are ones the code can run on: the committed gRPC code
refuses a grpcio older than the grpcio-tools that generated it, and a protobuf runtime
older than its gencode; the grpc helper packages move with grpcio."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "inference_lab" / "v1"


def floors() -> dict[str, tuple[int, ...]]:
    out = {}
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", spec)
        if m:
            out[m.group(1)] = tuple(int(x) for x in m.group(2).split("."))
    return out


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_grpcio_floor_is_at_least_the_generated_codes_grpc_version():
    generated = {version(m) for f in GENERATED.glob("*_pb2_grpc.py")
                 for m in re.findall(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", f.read_text())}
    assert generated, "no generated gRPC code found"
    have = floors()
    for package in ("grpcio", "grpcio-status", "grpcio-reflection", "grpcio-health-checking"):
        assert have[package] >= max(generated), (package, have[package], max(generated))


def test_protobuf_floor_is_at_least_the_gencode_version():
    pattern = re.compile(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
                         r"\s*(\d+),\s*(\d+),\s*(\d+),")
    gencode = {tuple(int(x) for x in m) for f in GENERATED.glob("*_pb2.py")
               for m in pattern.findall(f.read_text())}
    assert gencode, "no generated protobuf code found"
    assert floors()["protobuf"] >= max(gencode), (floors()["protobuf"], max(gencode))
