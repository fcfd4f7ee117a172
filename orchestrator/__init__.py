"""Orrery orchestrator: REST API, device gateway, task engine and store."""

__version__ = "0.1.0"
