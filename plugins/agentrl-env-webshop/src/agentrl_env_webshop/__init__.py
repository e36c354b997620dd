"""agentrl-env-webshop: the WebShop environment (search, compare and buy in a simulated shop)."""

__version__ = "0.1.0"
