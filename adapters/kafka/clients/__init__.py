"""Clients and appends: confluent-kafka's producer, consumers and admin client, wrapped.

Everything that talks to a broker lives here — client configuration, the typed errors, the
cluster provider, the admin calls, the request/reply sender and the record appends — so the
other rooms (facts, ops, reply, ownership) reason about Kafka without holding a client.
"""
