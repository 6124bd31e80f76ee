"""A conformance check of the signals routers and autoscalers read from a vLLM-compatible
server: the model-server protocol metrics, the OpenAI routes, load, server info, the
render API, KV-event sources and their events, sleep mode and the data-parallel rank
header. It speaks HTTP (and ZMQ for the KV events) only, so it runs against the lab or a
real vLLM alike; `inference-lab conformance URL` prints its report."""

from inference_lab.conformance.checks import FAIL, PASS, SKIP, Result, run_checks
from inference_lab.conformance.probe import Probe, Unreachable

__all__ = ["FAIL", "PASS", "SKIP", "Probe", "Result", "Unreachable", "run_checks"]
