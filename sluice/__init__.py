"""Sluice: durable document ingestion into a vector index, with an operator console and an HTTP API.

Floors, each importing only from the ones below it:

    sluice.errors, .settings, .files, .faults
                       the ground: exceptions, settings, file modes, fault points
    sluice.storage     models, the job state machine, queries, outbox, blobs, vectors, cache
    sluice.servers     the command lines of the servers Sluice starts, and the Chroma gate
    sluice.pipeline    parsing, running a job, the queue glue and recovery, reconcile
    sluice.ops         every operator action and read a front end offers
    sluice.console     the Streamlit console          sluice.cli   the ``sluice`` command
"""
