"""Who has the screen, on the agent: while a person has the device (an operator's takeover or the
owner's own), the model's input tools are refused and read-only ones still run; every change
voids the GUI observation (the hook), so the model observes afresh after a handback."""

from __future__ import annotations

from device_agent.takeover import Takeover


def test_while_a_person_has_the_device_the_models_input_tools_are_refused_and_reading_is_not() -> None:
    for side in ({"operator": True}, {"owner": True}):
        takeover = Takeover()
        takeover.set(by="ada", **side)
        assert takeover.active and takeover.by == "ada"
        assert takeover.refuses("gui.click", read_only=False)
        assert takeover.refuses("browser.browser_type", read_only=False)
        assert not takeover.refuses("gui.observe", read_only=True)
        assert not takeover.refuses("shell.run", read_only=False), "only the screen is the person's"
        assert "ada" in takeover.refusal()


def test_a_device_nobody_has_refuses_nothing() -> None:
    takeover = Takeover()
    assert not takeover.active
    assert not takeover.refuses("gui.click", read_only=False)


def test_the_owners_handback_leaves_an_operators_takeover_in_place() -> None:
    takeover = Takeover()
    takeover.set(operator=True, by="ada")
    takeover.set(owner=True, by="owner")
    takeover.set(owner=False)
    assert takeover.active and takeover.by == "ada"
    takeover.set(operator=False)
    assert not takeover.active


def test_every_change_of_who_has_the_screen_voids_the_observation_and_a_repeat_does_not() -> None:
    voided: list[str] = []
    takeover = Takeover()
    takeover.on_change(lambda: voided.append("void"))
    assert takeover.set(operator=True, by="ada")
    assert not takeover.set(operator=True, by="ada")
    assert takeover.set(operator=False)
    assert voided == ["void", "void"]


def test_a_hook_that_fails_does_not_stop_the_others() -> None:
    calls: list[str] = []
    takeover = Takeover()

    def broken() -> None:
        raise RuntimeError("gone")

    takeover.on_change(broken)
    takeover.on_change(lambda: calls.append("ok"))
    takeover.set(owner=True)
    assert calls == ["ok"]
