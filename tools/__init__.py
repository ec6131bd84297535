"""Tools around the framework, installed as ``purgatory.tools``: the benchmarks behind
``purgatory bench`` (``bench/``) and the reliability suite (``reliability/``: soak, faults, bad
inputs). They may use the core and the adapters; neither imports them (tests/repo checks it).
"""
