"""The offline disaggregated simulation agrees with the served engine: the same requests,
one at a time, through a real engine's prefill and decode replicas (gRPC) and through
`sim`'s driver give, per request, offline TTFT = the prefill replica's modelled TTFT + the
decode replica's, the same tokens pulled, and the same modelled pull times (the served
decode replica's transfer histogram)."""

import urllib.request

import pytest

from engine_helpers import collect, engine_stub, running_engine
from inference_lab.common.workload import LengthDist, WorkloadSpec
from inference_lab.engine.drivers.disagg import run_disaggregated
from inference_lab.engine.sim.config import default_deployments
from inference_lab.engine.sim.kv_transfer import PdLayout
from inference_lab.v1 import engine_pb2 as pb

REQUESTS = [(300, 4), (1500, 8), (700, 2), (64, 5)]  # (prompt tokens, output tokens)


def metric(port: int, name: str, engine: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
        text = resp.read().decode()
    key = f'{name}{{engine="{engine}",model_name="gpt-oss-20b"}}'
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(key))


async def served() -> tuple[list[tuple[float, float, float, int]], float]:
    """Per request: (prefill TTFT, decode TTFT, decode e2e, tokens pulled); and the decode
    replica's summed pull time."""
    rows = []
    async with running_engine(replicas=2, kv_roles=("kv_producer", "kv_consumer")) as server, \
            engine_stub(server) as stub:
        for prompt, output in REQUESTS:
            first = await collect(stub.Submit(pb.SubmitRequest(
                prompt_tokens=prompt, max_tokens=1, replica=0,
                kv_transfer_params=pb.KvTransferParams(do_remote_decode=True))))
            [p] = [e.finished for e in first if e.HasField("finished")]
            assert p.kv_transfer_params.do_remote_prefill
            second = await collect(stub.Submit(pb.SubmitRequest(
                prompt_tokens=prompt, max_tokens=output, replica=1,
                kv_transfer_params=p.kv_transfer_params)))
            [d] = [e.finished for e in second if e.HasField("finished")]
            assert d.completion_tokens == output
            rows.append((p.ttft_s, d.ttft_s, d.e2e_s, d.external_tokens))
        pulled = metric(server.metrics_port, "inference_lab_kv_transfer_seconds_sum", 1)
    return rows, pulled


async def test_offline_ttft_is_the_served_prefill_plus_decode_ttft_per_request():
    rows, pulled = await served()
    dep = default_deployments("b200")[0]
    fixed = LengthDist("fixed", value=1)  # (the lengths come with the arrivals)
    spec = WorkloadSpec(arrival_pattern="uniform", num_requests=len(REQUESTS),
                        input_len_dist=fixed, output_len_dist=fixed)
    arrivals = iter([(10.0 * i, p, o, b"") for i, (p, o) in enumerate(REQUESTS)])  # one at a time
    flows = []
    summary = run_disaggregated(dep, spec, PdLayout(1, 1, "rdma"), arrivals=arrivals, records=flows)
    assert summary["requests"]["completed"] == len(REQUESTS)
    assert [f.prompt_len for f in flows] == [p for p, _ in REQUESTS]
    for flow, (p_ttft, d_ttft, d_e2e, external) in zip(flows, rows):
        pre, dec = flow.prefill, flow.decode
        assert pre.first_token - pre.arrival == pytest.approx(p_ttft, rel=1e-9, abs=1e-12)
        assert dec.first_token - dec.arrival == pytest.approx(d_ttft, rel=1e-9, abs=1e-12)
        assert dec.first_token - flow.arrival == pytest.approx(p_ttft + d_ttft, rel=1e-9)
        assert dec.finish_time - flow.arrival == pytest.approx(p_ttft + d_e2e, rel=1e-9)
        assert dec.external_tokens == external == flow.prompt_len - 1
    transfer = sum(f.decode.transfer_s for f in flows)
    assert transfer > 0
    assert transfer == pytest.approx(pulled, rel=1e-9)
    assert summary["pd"]["transfers"] == {"pulled": 4, "recomputed": 0,
                                          "external_tokens": sum(p - 1 for p, _ in REQUESTS)}
    ttft = sorted(1000 * (p + d) for p, d, _, _ in rows)
    assert summary["latency_metrics"]["ttft_ms"]["min"] == pytest.approx(ttft[0], rel=1e-9)
