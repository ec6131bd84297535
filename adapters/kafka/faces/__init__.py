"""The faces users hold: ``KafkaPurgatory`` (threads) and ``AsyncKafkaPurgatory`` (asyncio).

They compose the other rooms — clients, facts, ops, reply — into one object with a purgatory per
operation kind, and own its lifecycle (connect, drain on signals, close).
"""
