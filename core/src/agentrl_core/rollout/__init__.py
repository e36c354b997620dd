"""Rollout: engines (protocol, client, HF server, SGLang driver), tool parsers, the agent loop.

Nothing heavy is imported here; torch and transformers load only with the engine modules.
See ``core/docs/engine.md`` for the engine protocol.
"""
