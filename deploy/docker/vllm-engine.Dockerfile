# The vllm-engine overlay's engine image: vLLM's OpenAI server with kvcache's Python client, whose
# kvcache_client.vllm is the secondary offloading tier vLLM loads by module_path (README "Use with
# vLLM"). Not built by the project's tests. From the repository root:
#   podman build -f deploy/docker/vllm-engine.Dockerfile -t vllm-kvcache:0.29.0-kvcache0.1.0 .
# VLLM_IMAGE must be a vLLM that loads out-of-tree secondary tiers by module_path
# (vllm/v1/kv_offload/tiering/factory.py, SecondaryTierFactory.get_tier_class).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.29.0
FROM ${VLLM_IMAGE}
COPY client/python /tmp/kvcache-client
# grpcio, protobuf, xxhash and numpy come with it from the engine image's index.
RUN python3 -m pip install --no-cache-dir /tmp/kvcache-client && rm -rf /tmp/kvcache-client
