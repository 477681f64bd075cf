"""The worker process: Huey's consumer (``consumer``) over the tasks, periodic rounds and start-up
hook of ``hooks``."""
