"""Sluice: durable document ingestion into a vector index, with an operator console.

Floors, each importing only from the ones below it:

    sluice.errors      the exception tree and ErrorKind
    sluice.storage     settings, models, the job state machine, queries, outbox, blobs, vectors, cache
    sluice.pipeline    the stages, the runner, the queue, tasks and recovery
    sluice.ops         every operator action and read a front end offers
    sluice.console     the Streamlit console          sluice.cli   the ``sluice`` command
"""
