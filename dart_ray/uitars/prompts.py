"""What the policy reads: the computer-use prompt, the history window, chat messages.

The prompt is ours, in our own words, but asks for exactly UI-TARS-1.5's output format and
action space, so the same prompt drives UI-TARS-1.5-7B and the tiny model alike.

The conversation follows UI-TARS: a system turn ("You are a helpful assistant."), a user turn
with the prompt and instruction, then alternating screenshots (user turns) and responses
(assistant turns), ending on the current screenshot. A long episode does not fit, so only the
newest `history_images` screenshots (the current one included) and the newest `history_turns`
responses are kept (DART-GUI keeps 5 and 35); an older turn whose screenshot fell out of the
window keeps its response, which is how the model remembers what it already did.

Messages are typed (`ChatMessage` with text and image parts); `to_template` turns them into
the dicts a Hugging Face chat template reads plus the list of images in order, and
`from_openai` reads the OpenAI chat format (images as data URLs) for the HTTP route.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

SYSTEM_PROMPT = "You are a helpful assistant."

COMPUTER_USE_PROMPT = """You operate a computer for a user. You see a screenshot after every \
action you take. Decide the single next action that moves the task forward.

## Answer format
```
Thought: ...
Action: ...
```

## Actions
click(start_box='<|box_start|>(x1,y1)<|box_end|>')
left_double(start_box='<|box_start|>(x1,y1)<|box_end|>')
right_single(start_box='<|box_start|>(x1,y1)<|box_end|>')
drag(start_box='<|box_start|>(x1,y1)<|box_end|>', end_box='<|box_start|>(x3,y3)<|box_end|>')
hotkey(key='ctrl c') # keys separated by spaces, lowercase
type(content='xxx') # end content with "\\n" to press Enter afterwards
scroll(start_box='<|box_start|>(x1,y1)<|box_end|>', direction='down or up or right or left')
wait() # pause 5 s and take a new screenshot
finished(content='xxx') # the task is done; content may report an answer
call_user() # the task cannot go on without the user

## Rules
- Coordinates are pixels of the screenshot as you see it.
- In Thought, name the element you act on and why, in one or two sentences.
- Write escapes in content as in a Python string: \\' for a quote, \\n for a new line.

## Task
{instruction}
"""


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ImagePart:
    image: bytes
    """Encoded image (PNG or JPEG)."""
    type: Literal["image"] = "image"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    parts: tuple[TextPart | ImagePart, ...]

    @classmethod
    def text(cls, role: Literal["system", "user", "assistant"], text: str) -> ChatMessage:
        return cls(role, (TextPart(text),))

    @property
    def images(self) -> list[bytes]:
        return [p.image for p in self.parts if isinstance(p, ImagePart)]


@dataclass(frozen=True, slots=True)
class Turn:
    """One step of an episode: the screenshot the policy saw and what it answered."""

    screenshot: bytes
    response: str | None = None
    """None for the current turn, which the policy is about to answer."""


def build_messages(
    instruction: str,
    turns: Sequence[Turn],
    history_images: int = 5,
    history_turns: int = 35,
    prompt: str = COMPUTER_USE_PROMPT,
) -> list[ChatMessage]:
    """Messages for the policy's next answer. `turns[-1]` is the current turn (no response).

    Of the n = len(turns) screenshots the newest `history_images` are kept; of the n - 1 past
    responses the newest `history_turns`. A past turn with neither left is dropped.
    """
    if not turns:
        raise ValueError("build_messages needs at least the current turn")
    if turns[-1].response is not None:
        raise ValueError("the last turn is the one to answer: its response must be None")
    if history_images < 1:
        raise ValueError("history_images must be at least 1 (the current screenshot)")
    n = len(turns)
    first_image = n - history_images
    first_response = (n - 1) - history_turns
    msgs = [
        ChatMessage.text("system", SYSTEM_PROMPT),
        ChatMessage.text("user", prompt.format(instruction=instruction)),
    ]
    for i, turn in enumerate(turns):
        if i >= first_image:
            msgs.append(ChatMessage("user", (ImagePart(turn.screenshot),)))
        if turn.response is not None and i >= first_response:
            msgs.append(ChatMessage.text("assistant", turn.response))
    return msgs


def to_template(messages: Sequence[ChatMessage]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Dicts for `tokenizer.apply_chat_template` and the images in the order they appear."""
    out: list[dict[str, Any]] = []
    images: list[bytes] = []
    for m in messages:
        content: list[dict[str, str]] = []
        for p in m.parts:
            if isinstance(p, ImagePart):
                content.append({"type": "image"})
                images.append(p.image)
            else:
                content.append({"type": "text", "text": p.text})
        out.append({"role": m.role, "content": content})
    return out, images


# --------------------------------------------------------------------------- OpenAI format


class BadRequest(ValueError):
    """A request the server cannot serve; the message says what is wrong (HTTP 400)."""


def _decode_data_url(url: str) -> bytes:
    head, sep, data = url.partition(",")
    if not url.startswith("data:") or not sep:
        raise BadRequest(
            "images must be data URLs (data:image/png;base64,...); remote URLs are not fetched"
        )
    if not head.endswith(";base64"):
        raise BadRequest("image data URLs must be base64-encoded (';base64,')")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise BadRequest(f"image data URL is not valid base64: {e}") from None


def _openai_parts(content: Any, where: str) -> tuple[TextPart | ImagePart, ...]:
    if isinstance(content, str):
        return (TextPart(content),)
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of parts")
    parts: list[TextPart | ImagePart] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(TextPart(part["text"]))
        elif kind == "image_url":
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else image_url
            if not isinstance(url, str):
                raise BadRequest(f"{where}.content[{j}].image_url.url must be a string")
            parts.append(ImagePart(_decode_data_url(url)))
        else:
            raise BadRequest(f"{where}.content[{j}] must be a text or image_url part")
    return tuple(parts)


def from_openai(messages: Any) -> list[ChatMessage]:
    """OpenAI chat messages -> ChatMessage list; raises BadRequest naming the bad field."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    out: list[ChatMessage] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages[{i}] must be an object")
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            raise BadRequest(f"messages[{i}].role must be system, user or assistant")
        out.append(ChatMessage(role, _openai_parts(m.get("content"), f"messages[{i}]")))
    return out
