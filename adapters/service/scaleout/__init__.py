"""Scale-out: which instance serves a partition, and what the others answer.

With ``scaleout.enabled`` instances share partitions through the Kafka adapter's ownership group;
a request for a partition owned elsewhere is redirected (307) or forwarded, and an operation whose
partition moves while it waits is answered MOVED. The redirect answers suit any HTTP framework.
"""
