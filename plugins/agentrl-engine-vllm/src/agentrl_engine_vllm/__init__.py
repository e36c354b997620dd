"""agentrl rollout engine ``vllm``: vLLM servers behind agentrl's engine protocol (README.md)."""

from importlib import metadata

__version__ = metadata.version("agentrl-engine-vllm")  # the root VERSION file, at build time
