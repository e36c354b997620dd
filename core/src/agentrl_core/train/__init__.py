"""The training half: buffer, advantages, losses, micro-batching, FSDP2 learner, weight sync.

One module per stage (docs/architecture.md section 6); import the one you need, e.g.
``from agentrl_core.train.buffer import GroupBuffer``. Nothing is imported here so that
``agentrl_core.train`` stays importable without torch (the buffer and the task stream do
not need it).
"""
