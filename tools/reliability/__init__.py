"""The reliability harness behind ``purgatory bench reliability`` and ``tests/tools``.

Soak load (:func:`run_soak`), the bad-input matrix, fault scenarios and the report they print.
Importing this package needs only the core: the Kafka fault scenarios (``kafka_faults``, the
``kafka`` extra) are imported by ``cli.py`` when they run.
"""

from ._bad_input import bad_input_matrix, check, isolated_environment
from ._faults import FAULTY_OPS_PER_KIND, FaultResult, callback_faults
from ._settings_fields import FieldSpec, env_name, settings_fields, toml_text
from ._soak import SoakResult, rss_bytes, run_soak

__all__ = [
    "FAULTY_OPS_PER_KIND",
    "FaultResult",
    "FieldSpec",
    "SoakResult",
    "bad_input_matrix",
    "callback_faults",
    "check",
    "env_name",
    "isolated_environment",
    "rss_bytes",
    "run_soak",
    "settings_fields",
    "toml_text",
]
