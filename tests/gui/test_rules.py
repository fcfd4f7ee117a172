"""T0: the pure rules of the gui toolset (no display): key grammar, text, coordinates, receipts, files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from device_agent.toolsets.gui.display import DisplayLock, display_key
from device_agent.toolsets.gui.receipts import CAPACITY, RETENTION_S, Outcome, Receipts
from device_agent.toolsets.gui.rules import (
    MAX_TEXT,
    RELEASE_ARGV,
    Gesture,
    GuiError,
    check_action_id,
    check_point,
    check_text,
    digest,
    parse_key,
    to_device,
    xdotool_argv,
)
from device_agent.toolsets.gui.screens import ScreenshotStore
from tests.gui.fakes import TINY_PNG, FakeClock


@pytest.mark.parametrize(
    ("key", "xdotool"),
    [
        ("ctrl+s", "ctrl+s"),
        ("CTRL+S", "ctrl+s"),
        ("Control+shift+t", "ctrl+shift+t"),
        ("enter", "Return"),
        ("Return", "Return"),
        ("alt+f4", "alt+F4"),
        ("super+e", "super+e"),
        ("ctrl+alt+shift+super+delete", "ctrl+alt+shift+super+Delete"),
        ("pagedown", "Next"),
        ("shift+tab", "shift+Tab"),
        ("a", "a"),
        ("7", "7"),
        ("ctrl+minus", "ctrl+minus"),
    ],
)
def test_valid_keys_map_to_xdotool_names(key: str, xdotool: str) -> None:
    assert parse_key(key) == xdotool


@pytest.mark.parametrize(
    "key",
    [
        "A;shutdown",
        "ctrl+s;reboot",
        "ctrl+$(id)",
        "`id`",
        "ctrl+s && rm",
        "ctrl s",
        "ctrl+ctrl+a",
        "control+ctrl+a",
        "ctrl+",
        "+a",
        "",
        "ctrl",
        "meta+a",
        "ctrl+shift+alt+super+ctrl+a",
        "--window",
        "ctrl+s type hello",
        "f13",
        "a" * 100,
        "ctrl+\x00",
        "ctrl+é",
    ],
)
def test_invalid_keys_are_refused(key: str) -> None:
    with pytest.raises(GuiError) as exc:
        parse_key(key)
    assert exc.value.code == "invalid_arguments"
    assert "gui.type" in exc.value.message  # the message says what to do instead


def test_text_limits_and_messages_never_echo_the_text() -> None:
    check_text("x" * MAX_TEXT)
    check_text("line one\n\tline two; $(touch x) 'q' \"q\" é ✓")
    secret = "hunter2-" * 300
    for bad in ["", secret, "a\x00b", "esc\x1b", "bell\x07"]:
        with pytest.raises(GuiError) as exc:
            check_text(bad)
        assert exc.value.code == "invalid_arguments"
        assert "hunter2" not in exc.value.message


def test_action_ids() -> None:
    check_action_id("0b7c2a6e-1f0a-4b7e-9a55-cb1f6f0c1e11")
    for bad in ["short", "x" * 129, "has space x", "semi;colon!", ""]:
        with pytest.raises(GuiError):
            check_action_id(bad)


def test_bounds_are_checked_in_screenshot_pixels() -> None:
    check_point(0, 0, 1280, 800)
    check_point(1279, 799, 1280, 800)
    for x, y in [(1280, 0), (0, 800), (-1, 5), (5, -1), (5000, 5000)]:
        with pytest.raises(GuiError) as exc:
            check_point(x, y, 1280, 800)
        assert exc.value.code == "invalid_arguments"
        assert "0 <= x <= 1279" in exc.value.message


def test_pixel_centre_mapping() -> None:
    # Without scaling the mapping is the identity, edges included.
    for x, y in [(0, 0), (1, 1), (639, 400), (1279, 799)]:
        assert to_device(x, y, (1280, 800), (1280, 800)) == (x, y)
    # A half-size screenshot: pixel 10 covers device 20-21, its centre is 21.
    assert to_device(10, 10, (640, 400), (1280, 800)) == (21, 21)
    assert to_device(0, 0, (640, 400), (1280, 800)) == (1, 1)
    assert to_device(639, 399, (640, 400), (1280, 800)) == (1279, 799)
    # A non-integer ratio stays inside the device.
    assert to_device(1279, 719, (1280, 720), (1920, 1080)) == (1919, 1079)


def test_typed_text_is_one_argv_element_after_double_dash() -> None:
    text = "--window 1 ; $(reboot) `id` 'q' \"q\" click 1"
    argv = xdotool_argv(Gesture("type", text=text))
    assert argv[-2:] == ["--", text]
    assert argv[0] == "type"
    assert xdotool_argv(Gesture("key", keys="ctrl+s")) == ["key", "--clearmodifiers", "ctrl+s"]
    click = xdotool_argv(Gesture("click", ((3, 4),), 3, count=2))
    assert click == ["mousemove", "3", "4", "click", "--repeat", "2", "--delay", "80", "3"]
    drag = xdotool_argv(Gesture("drag", ((0, 0), (10, 20))))
    assert drag[:4] == ["mousemove", "0", "0", "mousedown"] and drag[-2:] == ["mouseup", "1"]
    assert RELEASE_ARGV[:6] == ["mouseup", "1", "mouseup", "2", "mouseup", "3"]
    assert {"Control_L", "Alt_L", "Shift_L", "Super_L"} <= set(RELEASE_ARGV)


def test_digest_covers_every_argument_but_the_action_id() -> None:
    base = {"observation_id": "o1", "action_id": "a1", "x": 1, "y": 2}
    assert digest("click", base) == digest("click", {**base, "action_id": "other"})
    assert digest("click", base) == digest("click", dict(reversed(base.items())))
    assert digest("click", base) != digest("click", {**base, "x": 3})
    assert digest("click", base) != digest("double_click", base)


def test_receipts_same_args_replay_other_args_conflict() -> None:
    clock = FakeClock()
    book = Receipts(clock)
    assert book.lookup("act-1", "d1") is None
    book.reserve("act-1", "d1")
    pending = book.lookup("act-1", "d1")
    assert pending is not None and pending.code == "uncertain"  # reserved before input: never replayed
    book.finish("act-1", Outcome(True, {"status": "dispatched"}))
    assert book.lookup("act-1", "d1") == Outcome(True, {"status": "dispatched"})
    with pytest.raises(GuiError) as exc:
        book.lookup("act-1", "d2")
    assert exc.value.code == "id_conflict"
    clock.now += RETENTION_S + 1
    assert book.lookup("act-1", "d2") is None  # after 5 minutes the id is free again


def test_receipts_cap_prunes_only_expired_ones() -> None:
    clock = FakeClock()
    book = Receipts(clock)
    for n in range(CAPACITY):
        book.reserve(f"old-{n:05d}", "d")
    clock.now += RETENTION_S + 1
    book.reserve("new-00001", "d")  # the expired ones make room
    assert len(book) == 1
    for n in range(CAPACITY - 1):
        book.reserve(f"live-{n:05d}", "d")
    assert len(book) == CAPACITY
    with pytest.raises(GuiError) as exc:
        book.reserve("one-too-many", "d")
    assert exc.value.code == "action_limit"
    assert book.lookup("live-00000", "d") is not None  # no live receipt was dropped
    clock.now += RETENTION_S + 1
    book.reserve("one-too-many", "d")


def test_screenshots_are_private_capped_and_oldest_go_first(tmp_path: Path) -> None:
    store = ScreenshotStore(tmp_path / "shots", max_file_bytes=1000, max_dir_bytes=3 * len(TINY_PNG))
    paths = []
    for n in range(5):
        path = store.save(f"screen-{n}.png", TINY_PNG)
        os.utime(path, ns=(n * 10**9, n * 10**9))  # distinct ages, oldest first
        paths.append(path)
    assert stat.S_IMODE((tmp_path / "shots").stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths[2:])
    assert [p.exists() for p in paths] == [False, False, True, True, True]
    with pytest.raises(GuiError, match="limit per image"):
        store.save("big.png", TINY_PNG + b"\0" * 1000)
    with pytest.raises(GuiError, match="PNG"):
        store.save("fake.png", b"GIF89a")


def test_a_planted_file_is_never_written_through(tmp_path: Path) -> None:
    store = ScreenshotStore(tmp_path / "shots")
    target = tmp_path / "victim"
    target.write_text("keep")
    store.directory.joinpath("screen-x.png").symlink_to(target)
    with pytest.raises(GuiError, match="already exists"):
        store.save("screen-x.png", TINY_PNG)
    assert target.read_text() == "keep"


def test_display_lock_is_exclusive_and_freed_on_release(tmp_path: Path) -> None:
    assert display_key(":1") == display_key(":1.0") == display_key("unix:1") == "local-1"
    first, second = DisplayLock(":7", tmp_path), DisplayLock(":7.0", tmp_path)
    first.acquire()
    with pytest.raises(GuiError) as exc:
        second.acquire()
    assert exc.value.code == "busy" and str(os.getpid()) in exc.value.message
    assert DisplayLock(":8", tmp_path).probe() == "free"  # another display is another lock
    first.release()
    second.acquire()
    assert second.probe() == "held by this process"
    second.release()
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700
