"""agentrl-plugin-example: the ``calc`` environment, a template for environment plugins."""

from importlib import metadata

__version__ = metadata.version("agentrl-plugin-example")  # the root VERSION file, at build time
