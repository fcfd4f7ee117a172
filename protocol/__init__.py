"""Orrery device protocol, version 1 (SPEC section 4).

Sans-I/O: this package turns text into typed frames and back and keeps the per-session
sequencing state. It never touches a socket or reads a clock; callers pass time in.
"""

from protocol.codec import decode, encode
from protocol.errors import CloseCode, ErrorCode, ProtocolError
from protocol.messages import PROTOCOL_VERSION, SUPPORTED_VERSIONS, Message
from protocol.session import Session

__all__ = [
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "CloseCode",
    "ErrorCode",
    "Message",
    "ProtocolError",
    "Session",
    "decode",
    "encode",
]
