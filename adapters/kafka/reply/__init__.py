"""Request-reply over Kafka: a request record waits in the purgatory for its reply record.

The correlation headers, the delayed request, the reply router that hands replies to waiting
requests, and the ``@responder`` side that answers them (docs/design.md §9).
"""
