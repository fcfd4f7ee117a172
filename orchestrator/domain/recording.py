"""Whether an attempt's screen is recorded, and whether the recording is kept (pure rules).

An agent that can record announces it (`protocol.messages.FEATURE_RECORD`: it has a screen and
ffmpeg). A node's `record` decides; unset, agent nodes and nodes driving the `gui` or `browser`
tools are recorded and the recording is kept only when the attempt did not succeed (failed,
uncertain, cancelled): the evidence an operator wants, without the cost of keeping every run.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from orchestrator.domain.model import NodeKind, NodeSpec
from protocol.messages import FEATURE_RECORD

Mode = Literal["off", "failures", "always"]
SCREEN_NAMESPACES = ("gui", "browser")


def mode(spec: NodeSpec, features: Collection[str]) -> Mode:
    """How the node's attempts on a device with these `features` are recorded."""
    if FEATURE_RECORD not in features:
        return "off"
    if spec.record is not None:
        return spec.record
    if spec.kind is NodeKind.AGENT:
        return "failures"
    if any(c.tool.partition(".")[0] in SCREEN_NAMESPACES for c in spec.commands):
        return "failures"
    return "off"


def keep(recorded: Mode, succeeded: bool) -> bool:
    """Whether an ended attempt's recording becomes its artifact."""
    return recorded == "always" or (recorded == "failures" and not succeeded)
