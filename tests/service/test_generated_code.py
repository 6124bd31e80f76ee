"""The committed gRPC code (inference_lab/v1, inference_lab/vllm_grpc) is what protos/
generates today.

Regenerate with:
    python -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. \\
        protos/inference_lab/v1/engine.proto protos/inference_lab/vllm_grpc/vllm_engine.proto
(grpcio-tools is pinned in the test extras so the output is byte-stable.)
"""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# each proto under protos/ and the modules it generates (beside it, under the repository root)
PROTOS = {
    "inference_lab/v1/engine.proto": ("engine_pb2.py", "engine_pb2_grpc.py", "engine_pb2.pyi"),
    # vLLM's own engine service, its package name kept (vllm.grpc.engine)
    "inference_lab/vllm_grpc/vllm_engine.proto": (
        "vllm_engine_pb2.py", "vllm_engine_pb2_grpc.py", "vllm_engine_pb2.pyi"),
}


@pytest.mark.parametrize("proto", sorted(PROTOS))
def test_generated_grpc_code_is_up_to_date(tmp_path, proto):
    protoc = pytest.importorskip("grpc_tools.protoc")
    import grpc_tools

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    code = protoc.main(["protoc", f"-I{ROOT / 'protos'}", f"-I{include}",
                        f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}",
                        f"--pyi_out={tmp_path}", str(ROOT / "protos" / proto)])
    assert code == 0
    folder = Path(proto).parent
    for name in PROTOS[proto]:
        fresh = (tmp_path / folder / name).read_text()
        committed = (ROOT / folder / name).read_text()
        assert committed == fresh, f"{folder / name} is stale: regenerate it (see this file's docstring)"


def test_vllms_service_keeps_its_own_names():
    """vLLM's clients call /vllm.grpc.engine.VllmEngine/<Method>: the copy keeps them."""
    from inference_lab.vllm_grpc import vllm_engine_pb2

    service = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"]
    assert service.full_name == "vllm.grpc.engine.VllmEngine"
    assert [m.name for m in service.methods] == [
        "Generate", "Embed", "HealthCheck", "Abort", "GetModelInfo", "GetServerInfo"]
