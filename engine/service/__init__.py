"""The engine's gRPC edge: the `inference_lab.v1.Engine` service on the pacer (`rpc`), the
server's lifecycle (`server`), vLLM-named Prometheus metrics (`metrics`), and the guard
that turns undecodable request bytes into INVALID_ARGUMENT (`wire_guard`)."""
