"""Durable state: SQLAlchemy 2 async models and repository functions (SQLite or Postgres)."""
