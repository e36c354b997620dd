"""agentrl-env-webshop: the WebShop environment (search, compare and buy in a simulated shop)."""

from importlib import metadata

__version__ = metadata.version("agentrl-env-webshop")  # the root VERSION file, at build time
