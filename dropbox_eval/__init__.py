"""dropbox-eval: file-drop batch processor for an agent lane farm."""

__version__ = "0.1.0"
