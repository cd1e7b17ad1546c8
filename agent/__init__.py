"""The node agent: runs on each GPU host, speaks HTTP(S) to the portal with its per-node token.

It reports NVML inventory and telemetry (or a simulated host's), pulls its assignments, runs them
as process groups, and reports starts, logs and exits. It imports only the standard library,
`requests` and `pynvml` (nvidia-ml-py); never Django or the portal's code.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
