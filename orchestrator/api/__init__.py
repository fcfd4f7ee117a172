"""REST API (SPEC section 3): one router per resource."""
