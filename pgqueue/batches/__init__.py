"""The batches lane: batch-tier ``anthropic.messages`` jobs sent through Anthropic's Message
Batches API at half the price (docs/batches.md).

:mod:`~pgqueue.batches.outcomes` decides what each result does to its job (pure);
:mod:`~pgqueue.batches.lane` parks claimed jobs in a collecting batch;
:mod:`~pgqueue.batches.poller` seals, submits, reconciles, polls and finishes batches;
:mod:`~pgqueue.batches.startup` starts a worker's poller.
"""
