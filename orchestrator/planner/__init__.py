"""The LLM side: planning DAGs from requests, driving agent nodes, re-planning after failures."""
