"""Orrery's neutral layer: what the orchestrator and the device agent share, and the `orrery` entry point.

`orrery.logs` and `orrery.exits` import nothing of the project's: both `orchestrator` and `device_agent`
use them, and neither imports the other. `orrery.cli` is the one place above both: it imports the
agent's CLI or the server's lazily, so a device install (no `server` extra) runs `orrery agent`.
"""
