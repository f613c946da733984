"""Load a Qwen2.5-VL policy folder (UI-TARS-1.5-7B or the tiny model) and encode prompts.

Why not `AutoProcessor`: in transformers 5.x `Qwen2_5_VLProcessor` insists on a video
processor (`video_processor=None` fails; the real one needs torchvision), and
`AutoProcessor.from_pretrained` can quietly fall back to a bare tokenizer, which then drops the
image without an error. So `PolicyProcessor` holds the two parts that matter and does the one
thing the HF processor adds, explicitly: render the chat template (one `<|image_pad|>` per
image), tokenise, and expand each pad to the image's token count, `t*h*w / merge^2` of its
patch grid. The tests prove the pixels reach the model (a different image, different logits)
and that the ids match what vLLM's processor builds from the same folder. The processor's
other output, which tokens are image tokens, is `image_inputs`: without it transformers 5
silently drops Qwen2.5-VL's 3D image positions.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from dart_ray.models import lora
from dart_ray.uitars.prompts import BadRequest, ChatMessage, to_template

SUPPORTED_MODEL_TYPES = ("qwen2_5_vl",)
FORBIDDEN_IN_TEXT = (
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Control tokens that text parts may not contain: they would forge turns or image slots."""


class ModelDirError(ValueError):
    """The model folder is missing, incomplete, or not a Qwen2.5-VL model."""


def check_model_dir(path: str | Path) -> Path:
    """Raise ModelDirError naming the first problem with a policy folder; return it resolved."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ModelDirError(f"model folder {p} does not exist (make one: dart-ray model init)")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ModelDirError(f"model folder {p} has no config.json")
    try:
        model_type = json.loads(cfg.read_text()).get("model_type")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ModelDirError(f"{cfg} is not a JSON object: {e}") from None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelDirError(
            f"{cfg}: model_type {model_type!r} is not supported (expected one of "
            f"{SUPPORTED_MODEL_TYPES})"
        )
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise ModelDirError(f"model folder {p} has no weights (*.safetensors or *.bin)")
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        raise ModelDirError(f"model folder {p} has no tokenizer (tokenizer.json)")
    if not (p / "preprocessor_config.json").is_file():
        raise ModelDirError(f"model folder {p} has no image processor (preprocessor_config.json)")
    return p.resolve()


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    """Model inputs for one prompt; `input_ids` already hold the expanded image tokens."""

    input_ids: list[int]
    pixel_values: torch.Tensor | None
    """(sum of patches over images, 3 * 2 * 14 * 14) in the processor's layout."""
    image_grid_thw: torch.Tensor | None
    """(images, 3): temporal, height and width patches of each image."""
    model_sizes: tuple[tuple[int, int], ...]
    """(width, height) each image was resized to: the pixels the model's coordinates are in."""


class PolicyProcessor:
    """Chat template + tokenizer + Qwen2-VL image processor, without AutoProcessor's traps."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, image_processor: Qwen2VLImageProcessorPil
    ) -> None:
        if tokenizer.chat_template is None:
            raise ModelDirError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.merge = int(image_processor.merge_size)
        self.image_pad_id = self._id("<|image_pad|>")
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)

    def _id(self, token: str) -> int:
        i = self.tokenizer.convert_tokens_to_ids(token)
        if i is None or i == self.tokenizer.unk_token_id:
            raise ModelDirError(f"the tokenizer lacks the special token {token}")
        return int(i)

    @classmethod
    def from_dir(cls, path: str | Path) -> PolicyProcessor:
        p = check_model_dir(path)
        return cls(AutoTokenizer.from_pretrained(p), Qwen2VLImageProcessorPil.from_pretrained(p))

    @property
    def min_pixels(self) -> int:
        return int(self.image_processor.size["shortest_edge"])

    @property
    def max_pixels(self) -> int:
        return int(self.image_processor.size["longest_edge"])

    def special_ids(self) -> dict[str, int]:
        """Every special (added) token of the vocabulary, by text."""
        return {
            t.content: int(i) for i, t in self.tokenizer.added_tokens_decoder.items() if t.special
        }

    def suppressed_ids(self, allow: Sequence[str] = ()) -> list[int]:
        """Special tokens the policy must never sample: all but the end token and `allow`.

        A sampled `<|image_pad|>` would make the training forward fail ("image features and
        image tokens do not match"), and the others have no meaning in a response.
        """
        keep = {self.eos_id} | {self._id(t) for t in allow}
        return sorted(i for i in self.special_ids().values() if i not in keep)

    def render(self, messages: Sequence[ChatMessage]) -> tuple[str, list[bytes]]:
        """The chat template's text (one image pad per image) and the images in order."""
        for i, m in enumerate(messages):
            for part in m.parts:
                if part.type == "text":
                    bad = next((t for t in FORBIDDEN_IN_TEXT if t in part.text), None)
                    if bad is not None:
                        raise BadRequest(f"message {i} ({m.role}) contains the control token {bad}")
        template_messages, images = to_template(messages)
        text = self.tokenizer.apply_chat_template(
            template_messages, tokenize=False, add_generation_prompt=True
        )
        return str(text), images

    def load_images(self, images: Sequence[bytes]) -> list[Image.Image]:
        out = []
        for k, data in enumerate(images):
            try:
                with Image.open(io.BytesIO(data)) as im:
                    out.append(im.convert("RGB"))
            except (UnidentifiedImageError, OSError) as e:
                raise BadRequest(f"image {k} is not a readable PNG/JPEG: {e}") from None
        return out

    def encode(self, messages: Sequence[ChatMessage]) -> EncodedPrompt:
        text, image_bytes = self.render(messages)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        n_pads = sum(1 for i in ids if i == self.image_pad_id)
        if n_pads != len(image_bytes):
            raise BadRequest(
                f"the chat template made {n_pads} image slots for {len(image_bytes)} images"
            )
        if not image_bytes:
            return EncodedPrompt(list(ids), None, None, ())
        processed = self.image_processor(images=self.load_images(image_bytes), return_tensors="pt")
        grid = processed["image_grid_thw"]
        counts = [int(g.prod()) // (self.merge**2) for g in grid]
        expanded: list[int] = []
        k = 0
        for i in ids:
            if i == self.image_pad_id:
                expanded.extend([i] * counts[k])
                k += 1
            else:
                expanded.append(i)
        patch = int(self.image_processor.patch_size)
        sizes = tuple((int(g[2]) * patch, int(g[1]) * patch) for g in grid)
        return EncodedPrompt(expanded, processed["pixel_values"], grid, sizes)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


def image_inputs(
    input_ids: torch.Tensor,
    pixel_values: torch.Tensor | None,
    image_grid_thw: torch.Tensor | None,
    image_pad_id: int,
) -> dict[str, torch.Tensor]:
    """The image arguments of a Qwen2.5-VL forward or `generate` for a batch of token ids:
    the pixels, their patch grids, and which tokens are image tokens (`mm_token_type_ids`, 1
    on `<|image_pad|>`, 0 on text). Without the token types transformers 5 cannot build
    M-RoPE's 3D positions (time, row, column of each image patch; the text after an image
    resumes after the image's largest position) and silently numbers every token 1D, which
    is not the model UI-TARS was trained as: every forward that sees images goes through
    here, the engine's, the trainer's and SFT's alike. Empty without images."""
    if pixel_values is None:
        return {}
    return {
        "pixel_values": pixel_values,
        "image_grid_thw": image_grid_thw,  # type: ignore[dict-item]
        "mm_token_type_ids": (input_ids == image_pad_id).int(),
    }


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> Qwen2_5_VLForConditionalGeneration:
    """The policy model from a checked folder, in eval mode. A LoRA checkpoint (an adapter
    folder, `dart_ray.models.lora`) loads its base and applies the adapters unmerged, so a
    server started from it takes later adapter versions in place."""
    p = check_model_dir(path)
    if lora.is_adapter_checkpoint(p):
        base, spec, state = lora.read_adapter_checkpoint(p)
        model = Qwen2_5_VLForConditionalGeneration.from_pretrained(
            check_model_dir(base), dtype=dtype
        )
        lora.load_adapter(model, spec, {k: v.to(dtype) for k, v in state.items()})
        return model.to(device).eval()
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(p, dtype=dtype)
    return model.to(device).eval()
