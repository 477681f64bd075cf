"""The HTTP API: routers per resource over ``sluice.ops``, API keys and their scopes as a
dependency, problem+json errors, idempotent POSTs and the server-sent event stream. ``sluice serve
api`` serves ``sluice.api.server:app`` with uvicorn."""
