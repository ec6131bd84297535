"""One benchmark side in a fresh process: ``python -m purgatory.tools.bench._worker '<json spec>'``.

Each side of a comparison runs in its own subprocess, so no side inherits another's heap,
allocator state or garbage. The spec names the benchmark (``timer``, ``purgatory``, ``expiry``)
and its parameters; the figures come back as one JSON line on stdout after ``RESULT_MARKER``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["RESULT_MARKER", "run_spec"]

RESULT_MARKER = "@@purgatory-bench-result@@ "


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    bench = spec["bench"]
    if bench == "timer":
        from .core.timer import run_workload

        return run_workload(
            spec["workload"], spec["side"], spec["n"], spec["seed"], spec.get("iterations", 200_000)
        )
    if bench in ("purgatory", "purgatory_memory") and spec["side"] == "jvm":
        from .core.jvm import run_jvm_side

        return run_jvm_side(bench, spec["params"], spec["seed"])
    if bench == "purgatory":
        from .core.purgatory_perf import run_side

        return run_side(spec["side"], spec["params"], spec["seed"])
    if bench == "purgatory_memory":
        from .core.purgatory_perf import run_memory_side

        return run_memory_side(spec["side"], spec["params"], spec["seed"])
    if bench == "expiry":
        from .core.expiry import run_side as run_expiry

        return run_expiry(spec["side"], spec["params"], spec["seed"])
    raise ValueError(f"unknown benchmark {bench!r}")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m purgatory.tools.bench._worker '<json spec>'", file=sys.stderr)
        return 2
    from purgatory import configure_logging

    configure_logging("WARNING")  # debug lines (purges, ...) would cost the measured side time
    result = run_spec(json.loads(argv[1]))
    print(RESULT_MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
