"""The prompt, the history window and the OpenAI message format."""

from __future__ import annotations

import base64

import pytest

from dart_ray.uitars.prompts import (
    COMPUTER_USE_PROMPT,
    SYSTEM_PROMPT,
    BadRequest,
    ChatMessage,
    ImagePart,
    TextPart,
    Turn,
    build_messages,
    from_openai,
    to_template,
)


def _turns(n: int) -> list[Turn]:
    """n past turns (screenshots b's0'.. with responses 'r0'..) plus the current one."""
    past = [Turn(f"s{i}".encode(), f"r{i}") for i in range(n)]
    return [*past, Turn(f"s{n}".encode())]


def _shape(msgs: list[ChatMessage]) -> list[str]:
    out = []
    for m in msgs[2:]:
        for p in m.parts:
            out.append(p.image.decode() if isinstance(p, ImagePart) else p.text)
    return out


def test_first_step_is_system_prompt_and_screenshot() -> None:
    msgs = build_messages("open settings", _turns(0), history_images=5, history_turns=35)
    assert msgs[0] == ChatMessage.text("system", SYSTEM_PROMPT)
    assert msgs[1].role == "user" and "## Task\nopen settings" in msgs[1].parts[0].text  # type: ignore[union-attr]
    assert _shape(msgs) == ["s0"]


def test_history_window_keeps_newest_images_and_responses() -> None:
    # 6 past turns + current = 7 screenshots, 6 responses. k=3 images: s4, s5, s6.
    # m=4 responses: r2..r5. Turns 0 and 1 have neither and vanish; 2 and 3 keep only text.
    msgs = build_messages("t", _turns(6), history_images=3, history_turns=4)
    assert _shape(msgs) == ["r2", "r3", "s4", "r4", "s5", "r5", "s6"]
    roles = [m.role for m in msgs[2:]]
    assert roles == ["assistant", "assistant", "user", "assistant", "user", "assistant", "user"]


def test_history_window_zero_turns_keeps_only_images() -> None:
    msgs = build_messages("t", _turns(2), history_images=2, history_turns=0)
    assert _shape(msgs) == ["s1", "s2"]


def test_build_messages_rejects_bad_windows() -> None:
    with pytest.raises(ValueError, match="at least the current turn"):
        build_messages("t", [])
    with pytest.raises(ValueError, match="must be None"):
        build_messages("t", [Turn(b"x", "answered")])
    with pytest.raises(ValueError, match="history_images"):
        build_messages("t", _turns(1), history_images=0)


def test_prompt_names_every_action_of_the_grammar() -> None:
    for name in ("click(", "left_double(", "right_single(", "drag(", "hotkey(", "type(",
                 "scroll(", "wait()", "finished(", "call_user()"):  # fmt: skip
        assert name in COMPUTER_USE_PROMPT


def test_to_template_lists_images_in_order() -> None:
    msgs = [
        ChatMessage("user", (TextPart("a"), ImagePart(b"1"))),
        ChatMessage.text("assistant", "b"),
        ChatMessage("user", (ImagePart(b"2"),)),
    ]
    dicts, images = to_template(msgs)
    assert images == [b"1", b"2"]
    assert dicts[0] == {
        "role": "user",
        "content": [{"type": "text", "text": "a"}, {"type": "image"}],
    }


def test_from_openai_reads_text_and_data_urls() -> None:
    url = "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
    msgs = from_openai(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]},
        ]
    )
    assert msgs[0] == ChatMessage.text("system", "be brief")
    assert msgs[1].images == [b"\x89PNG"]


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([], "non-empty list"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user", "content": [{"type": "audio"}]}], "content[0] must be a text"),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                }
            ],
            "remote URLs are not fetched",
        ),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": "data:;base64,@@"}]}],
            "not valid base64",
        ),
    ],
)
def test_from_openai_names_the_bad_field(messages: object, error: str) -> None:
    with pytest.raises(BadRequest, match=error.replace("[", r"\[").replace("]", r"\]")):
        from_openai(messages)
