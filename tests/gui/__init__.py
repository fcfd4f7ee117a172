"""Tests of the `gui` toolset: rules and controller on a fake backend (T0), X11 under Xvfb (T2)."""
