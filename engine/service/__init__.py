"""The engine's gRPC edge: the `inference_lab.v1.Engine` service on the fleet (`rpc`: the
admission funnel, Submit, the Session, metrics calls; `control`: capacity, replicas,
faults, models and LoRA adapters; `session`: a Session's batches and their writer;
`refusals`: the one refusal table; `messages`: core objects as messages), the server's
lifecycle (`server`), vLLM-named Prometheus metrics (`metrics`), and the guard that turns
undecodable request bytes into INVALID_ARGUMENT (`wire_guard`)."""
