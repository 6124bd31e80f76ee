"""inference-lab: the one import namespace of the project.

  inference_lab.v1        the generated gRPC API (protos/inference_lab/v1/engine.proto)
  inference_lab.common    what both services share: TOML reading, workloads, the bearer check
  inference_lab.engine    the simulated GPU engine (source folder `engine/`)
  inference_lab.gateway   the OpenAI-compatible HTTP gateway (source folder `gateway/`)
  inference_lab.cli       the `inference-lab` command (top layer)
"""

__version__ = "0.1.0"
