"""Alembic migrations; `orchestrator.store.migrate` runs them."""
