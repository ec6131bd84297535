"""Every benchmark of the project, by subject, and what they share.

- ``core/``: the timing wheel, the purgatory, expiry (``purgatory bench timer|purgatory|expiry``);
- ``kafka/``: the change feed and produce on a real cluster (``bench kafka|produce``);
- ``service/``: the HTTP service's long polls, their clients, scale-out (``bench fanout|scaleout``);
- ``reply/``: request-reply over Kafka (``bench request-reply``) and its per-stage trace;
- ``spark/``: the batch journal job (``bench pipeline``).

Shared: :mod:`.measure` (percentiles, CPU, RSS, child processes), the side runner (sides in
subprocesses, medians and same-run ratios) and the report. Benches use the adapters only through
their public faces (tests/repo/test_layering.py).
"""

from ._runner import Comparison, SideSpec, Target

__all__ = ["Comparison", "SideSpec", "Target"]
