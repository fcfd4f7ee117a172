"""Device WebSocket endpoint and the live session registry."""
