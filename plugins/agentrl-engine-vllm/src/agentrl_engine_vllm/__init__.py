"""agentrl rollout engine ``vllm``: vLLM servers behind agentrl's engine protocol (README.md)."""

__version__ = "0.1.0"
