"""The committed gRPC code (inference_lab/v1) is what protos/ generates today.

Regenerate with:
    python -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. \\
        protos/inference_lab/v1/engine.proto
(grpcio-tools is pinned in the test extras so the output is byte-stable.)
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO = "inference_lab/v1/engine.proto"
GENERATED = ("engine_pb2.py", "engine_pb2_grpc.py", "engine_pb2.pyi")


def test_generated_grpc_code_is_up_to_date(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc")
    import grpc_tools

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    code = protoc.main(["protoc", f"-I{ROOT / 'protos'}", f"-I{include}",
                        f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", str(ROOT / "protos" / PROTO)])
    assert code == 0
    for name in GENERATED:
        fresh = (tmp_path / "inference_lab" / "v1" / name).read_text()
        committed = (ROOT / "inference_lab" / "v1" / name).read_text()
        assert committed == fresh, f"inference_lab/v1/{name} is stale: regenerate it (see this file's docstring)"
