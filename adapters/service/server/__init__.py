"""Running the service: uvicorn with the service's protocols, in the foreground or on a thread.

``uvicorn_options`` picks the protocol classes (``http``) and limits from the settings;
``BackgroundServer`` runs the app on a thread (``purgatory run``, the tests); ``_main`` is the
README's main job behind ``purgatory run``. The public commands keep their paths:
``python -m purgatory.adapters.service.serve`` and ``purgatory.adapters.service.run``.
"""
