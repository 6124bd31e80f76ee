"""vLLM's gRPC engine service (vllm.grpc.engine.VllmEngine): the code generated from
protos/inference_lab/vllm_grpc/vllm_engine.proto, committed (tests/service/test_generated_code.py)."""
