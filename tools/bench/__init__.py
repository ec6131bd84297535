"""The core's benchmarks (``purgatory bench timer|purgatory|expiry``) and the harness the
adapters' benchmarks share: sides run in subprocesses, medians and same-run ratios."""

from ._runner import Comparison, SideSpec, Target

__all__ = ["Comparison", "SideSpec", "Target"]
