"""gpucloud: command-line client for the GPU Cloud Portal's public API."""

__version__ = "0.1.0"
