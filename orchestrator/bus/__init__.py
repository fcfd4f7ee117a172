"""Event fan-out to subscribers (SSE). In-process by default; Redis across replicas."""
