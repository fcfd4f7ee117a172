"""`python -m device_agent` runs the agent (the same as `orrery agent`)."""

from device_agent.cli import main

main()
