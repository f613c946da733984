"""A tiny Qwen2.5-VL built entirely on this machine: model, tokenizer, chat template, processor.

Nothing may be downloaded at run time, yet every part of dart-ray must run the code path that
serves UI-TARS-1.5-7B. So the tiny model is the real `Qwen2_5_VLForConditionalGeneration` with
small dimensions and random weights, saved in Hugging Face format with

- a byte-level BPE tokenizer trained here (with `tokenizers`) on text of the kind the policy
  reads and writes, digits split one per token as in Qwen, plus every Qwen special token
  (`<|im_start|>`, `<|image_pad|>`, `<|box_start|>`, ...), all marked special;
- a chat template in the Qwen2-VL layout (`<|im_start|>role\\n...<|im_end|>`, an image as
  `<|vision_start|><|image_pad|><|vision_end|>`), written here;
- the Qwen2-VL image processor (its PIL backend, which needs no torchvision), built from its
  class with explicit patch, merge and pixel-budget parameters.

`dart_ray.models.loading.load_policy` then loads the folder exactly as it loads UI-TARS.
The default dimensions (~0.4M parameters) make a forward pass on a 320x240 screenshot take
tens of milliseconds on one CPU core, which keeps the test suite fast.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from dart_ray.uitars.actions import MAX_PIXELS, MIN_PIXELS

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Qwen2.5-VL's special tokens, in Qwen's order (ids 0..13 here)."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or part['type'] == 'image_url' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The Qwen2-VL chat layout; each image part becomes one `<|image_pad|>` that the processor
expands to the image's token count."""


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Dimensions of the tiny model. The defaults are chosen for CPU speed, not quality."""

    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_intermediate_size: int = 64
    vision_heads: int = 2
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    seed: int = 0

    def __post_init__(self) -> None:
        head_dim, rem = divmod(self.hidden_size, self.num_heads)
        if rem or head_dim % 2:
            raise ValueError(
                f"hidden_size {self.hidden_size} must split into {self.num_heads} even heads"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.vision_hidden_size % self.vision_heads:
            raise ValueError("vision_hidden_size must be a multiple of vision_heads")


def mrope_section(head_dim: int) -> list[int]:
    """Split head_dim/2 rotary frequencies over (time, height, width) like Qwen's [16, 24, 24].

    Qwen gives time 1/4 and each spatial axis 3/8 of the 64 frequencies of its 128-dim heads.
    For our 32-dim heads (vLLM's CPU attention needs at least 32): 16 -> [4, 6, 6].
    """
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def _corpus() -> list[str]:
    """Text like what the policy reads and writes, to give the BPE merges something to learn."""
    from dart_ray.uitars.prompts import COMPUTER_USE_PROMPT

    lines = [COMPUTER_USE_PROMPT.format(instruction="open the settings and turn on dark mode")]
    verbs = ("click", "open", "close", "select", "type in")
    things = ("red button", "file menu", "save dialog", "search field", "OK button", "window")
    for i in range(200):
        x, y = (i * 37) % 1000, (i * 53) % 1000
        lines.append(
            f"Thought: I should {verbs[i % len(verbs)]} the {things[i % len(things)]}.\n"
            f"Action: click(start_box='<|box_start|>({x},{y})<|box_end|>')"
        )
    lines += ["hotkey(key='ctrl c')", "type(content='hello world\\n')", "scroll(direction='down')"]
    lines += ["drag(start_box='(1,2)', end_box='(3,4)')", "wait()", "finished(content='done')"]
    return lines


def build_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on the spot, with Qwen's special tokens and template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in ("<|im_end|>",)],
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_image_processor(
    min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> Qwen2VLImageProcessorPil:
    """The Qwen2-VL image processor with UI-TARS's pixel budget (patch 14, merge 2 -> 28)."""
    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )


def build_config(tokenizer: PreTrainedTokenizerFast, spec: TinySpec) -> Qwen2_5_VLConfig:
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = spec.hidden_size // spec.num_heads
    text = {
        "vocab_size": len(tokenizer),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "mrope_section": mrope_section(head_dim),
        },
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
    }
    vision = {
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden_size,
        "intermediate_size": spec.vision_intermediate_size,
        "num_heads": spec.vision_heads,
        "out_hidden_size": spec.hidden_size,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "fullatt_block_indexes": [spec.vision_depth - 1],
    }
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast, spec: TinySpec = TinySpec()
) -> Qwen2_5_VLForConditionalGeneration:
    """Random weights, seeded by `spec.seed`, in float32."""
    torch.manual_seed(spec.seed)
    model = Qwen2_5_VLForConditionalGeneration(build_config(tokenizer, spec))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def save_tiny_model(out: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """Build the tiny model and write it as an HF folder that `load_policy` (and vLLM) read."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.vocab_size)
    model = build_model(tokenizer, spec)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    build_image_processor(spec.min_pixels, spec.max_pixels).save_pretrained(out)
    (out / "dart_ray_tiny.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return out


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
