"""Methods added to vLLM's workers (``--worker-extension-cls``), called through ``/collective_rpc``.

vLLM imports this module inside its worker processes, so it imports only what the
methods need, when they run.
"""

from __future__ import annotations

from typing import Any


class AgentrlWorkerExtension:
    """Mixed into vLLM's Worker class; ``self`` is the worker."""

    def agentrl_weight_digests(self) -> dict[str, Any]:
        """sha256 and dtype of every weight, in Hugging Face names (see :mod:`.digests`)."""
        from agentrl_engine_vllm.digests import engine_digests

        tp_size = self.vllm_config.parallel_config.tensor_parallel_size  # type: ignore[attr-defined]
        return engine_digests(self.model_runner.get_model(), tp_size)  # type: ignore[attr-defined]

    def agentrl_reload_weights(self, weights_path: str) -> None:
        """vLLM's in-place reload, then the CPU kernels of embeddings rebuilt from the new values.

        On vLLM's CPU backend an embedding keeps a GEMM kernel (oneDNN) built from its weight
        for a tied output head; the in-place reload refreshes the weight but the head kept
        multiplying with the old copy (caught by the bit-exact check of :mod:`.digests`).
        """
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
        text_config = self.vllm_config.model_config.hf_config.get_text_config()  # type: ignore[attr-defined]
        if getattr(text_config, "tie_word_embeddings", False) and head is not None and embed is not None \
                and head is not embed and head.weight is not embed.weight:
            head.weight = embed.weight  # the reload replaced the embedding's tensor: tie them again
        for module in model.modules():
            if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)
