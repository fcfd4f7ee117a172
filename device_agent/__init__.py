"""Orrery device agent: connects to an orchestrator and runs MCP toolsets locally."""

__version__ = "0.1.0"
