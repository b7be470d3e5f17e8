"""htmllm inference service: prune, tokenize, batch and embed raw HTML pages."""

__version__ = "0.1.0"
