"""The core's benchmarks: the timing wheel (``timer``), the purgatory (``purgatory_perf``, after
Kafka's TestPurgatoryPerformance, with its JVM side in ``jvm``), expiry lateness (``expiry``), and
the baselines they are compared with (``baselines``). No Kafka."""
