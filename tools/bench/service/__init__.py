"""The HTTP service's benchmarks: idle long polls held and answered (``fanout``, ``purgatory bench
fanout``; its clients ``h1_client`` and ``h2_client``), the floor under it without ASGI
(``fanout_floor``), the feed's cost per completed long poll (``completion_probe``), large
``min_bytes`` long polls vs memory (``min_bytes_flood``) and scale-out over instances
(``scaleout``, ``purgatory bench scaleout``)."""
