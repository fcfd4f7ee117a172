"""Live views of devices' screens: the relay of their frames to viewers on any replica, view ids,
and input forwarded to a device an operator has taken over (`hub`, `relay`, `tickets`)."""
