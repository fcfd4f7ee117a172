"""Screenshots in results: over the size cap, the newest image is the one kept (issue 19: the gui
toolset's marked screenshot follows the plain one, and a model is shown the last image)."""

from __future__ import annotations

from mcp.types import CallToolResult, ImageContent, TextContent

from device_agent.router import MAX_IMAGE_BYTES, result_images


def image(fill: str, size: int) -> ImageContent:
    return ImageContent(type="image", data=fill * size, mime_type="image/png")


def test_over_the_cap_the_last_image_is_kept_and_the_earlier_one_is_marked_omitted() -> None:
    size = MAX_IMAGE_BYTES // 2 + 1
    raw = CallToolResult(
        content=[image("p", size), image("m", size), TextContent(type="text", text="{}")], structured_content={}
    )
    plain, marked = result_images(raw)
    assert "data" not in plain and plain["omitted"] == f"over {MAX_IMAGE_BYTES} bytes"
    assert marked["data"] == "m" * size


def test_under_the_cap_every_image_is_kept_in_order() -> None:
    raw = CallToolResult(content=[image("a", 10), image("b", 10)], structured_content={})
    assert [i["data"] for i in result_images(raw)] == ["a" * 10, "b" * 10]
