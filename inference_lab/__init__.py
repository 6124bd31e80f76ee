"""inference-lab: the command line and the generated gRPC API (inference_lab.v1)."""

__version__ = "0.1.0"
