"""Applies domain decisions: the scheduler loop, device queues, timeouts and recovery."""
