"""``agentrl model init``: a small local Qwen2-architecture model for CPU runs and tests.

:func:`init_model` writes a randomly initialised model, a tokenizer trained on a local
corpus and the Qwen2.5 chat template (:mod:`.chat_template`) to a folder that every engine
and the learner load like any Hugging Face checkpoint. Unrelated to rollouts: it only
makes a model to roll out with.
"""

from agentrl_core.tinymodel.model import MODEL_SIZES, SPECIAL_TOKENS, corpus_sources, init_model, training_corpus

__all__ = ["MODEL_SIZES", "SPECIAL_TOKENS", "corpus_sources", "init_model", "training_corpus"]
