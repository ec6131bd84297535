"""The Kafka adapter's benchmarks: the change feed's completion lag and request rate (``feed``,
``purgatory bench kafka``; the broker's GC pauses read by ``broker_pauses``) and produce
throughput against plain clients (``produce``, ``purgatory bench produce``). Real Kafka."""
