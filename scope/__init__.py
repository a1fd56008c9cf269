"""scope: a provider-neutral chat protocol and a conversation history for async Python."""

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"
