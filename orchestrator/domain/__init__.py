"""Pure decisions: DAG validation and progress, lifecycle, placement, retries, templates.

Nothing here does I/O; the engine applies these decisions to the store and the devices.
"""
