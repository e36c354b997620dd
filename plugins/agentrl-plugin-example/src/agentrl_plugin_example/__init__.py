"""agentrl-plugin-example: the ``calc`` environment, a template for environment plugins."""

__version__ = "0.1.0"
