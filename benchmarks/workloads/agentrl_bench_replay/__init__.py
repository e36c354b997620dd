"""A benchmark-only environment that replays recorded workloads of the real environments."""
