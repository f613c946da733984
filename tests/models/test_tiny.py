"""The tiny Qwen2.5-VL: built locally, saved in HF format, loaded by the UI-TARS code path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dart_ray.models.loading import ModelDirError, PolicyProcessor, check_model_dir, load_model
from dart_ray.models.tiny import SPECIAL_TOKENS, TinySpec, mrope_section
from dart_ray.uitars.actions import smart_resize
from dart_ray.uitars.prompts import BadRequest, ChatMessage, TextPart
from tests.conftest import TINY_TEST_PIXELS
from tests.policy_helpers import png, request


def test_folder_has_what_transformers_and_vllm_read(tiny_model_dir: Path) -> None:
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "preprocessor_config.json",
    } <= names
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen2_5_vl"
    assert cfg["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]


def test_special_tokens_are_single_special_ids(tiny_model_dir: Path) -> None:
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    special = proc.special_ids()
    assert set(SPECIAL_TOKENS) <= set(special)
    for tok in SPECIAL_TOKENS:  # each is one id, never split into pieces
        assert proc.tokenizer(tok, add_special_tokens=False)["input_ids"] == [special[tok]]
    # every special token but the end token is suppressed when sampling
    assert proc.suppressed_ids() == sorted(i for t, i in special.items() if t != "<|im_end|>")
    assert special["<|box_start|>"] not in proc.suppressed_ids(["<|box_start|>"])
    # digits are single tokens (coordinates are written digit by digit, as in Qwen)
    assert proc.tokenizer.tokenize("1234") == ["1", "2", "3", "4"]


def test_chat_template_renders_the_qwen_layout(tiny_model_dir: Path) -> None:
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    text, images = proc.render(
        [
            ChatMessage.text("system", "sys"),
            *request(screens=(png((0, 0, 0)),)).messages[2:],
        ]
    )
    assert text == (
        "<|im_start|>system\nsys<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert len(images) == 1


def test_image_tokens_follow_the_patch_grid(tiny_model_dir: Path) -> None:
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    # 112x112 is within [3136, 50176] px and a multiple of 28: kept. 112/14 = 8 patches a
    # side, 8*8 = 64 patches, merged 2x2 -> 16 image tokens. 200x100 (20,000 px): rounded to
    # 196x112 -> 14x8 patches = 112 -> 28 tokens.
    enc = proc.encode(request(screens=(png((1, 2, 3)), png((4, 5, 6), size=(200, 100)))).messages)
    assert enc.image_grid_thw.tolist() == [[1, 8, 8], [1, 8, 14]]  # type: ignore[union-attr]
    assert enc.input_ids.count(proc.image_pad_id) == 16 + 28
    assert enc.pixel_values.shape == (64 + 112, 3 * 2 * 14 * 14)  # type: ignore[union-attr]
    assert enc.model_sizes == ((112, 112), (196, 112))
    h, w = smart_resize(100, 200, 28, *TINY_TEST_PIXELS)
    assert (w, h) == (196, 112)


def test_pixels_reach_the_model(tiny_model_dir: Path) -> None:
    """The trap this guards: a processor that silently drops the image gives equal logits."""
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    model = load_model(tiny_model_dir)

    def logits(screen: bytes) -> torch.Tensor:
        enc = proc.encode(request(screens=(screen,)).messages)
        ids = torch.tensor([enc.input_ids])
        with torch.no_grad():
            out = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                pixel_values=enc.pixel_values,
                image_grid_thw=enc.image_grid_thw,
            )
        return out.logits[0, -1]

    red, red_again, blue = (
        logits(png((255, 0, 0))),
        logits(png((255, 0, 0))),
        logits(png((0, 0, 255))),
    )
    assert torch.equal(red, red_again)
    assert (red - blue).abs().max() > 1e-3
    # a white square in one corner is enough to move the next-token distribution
    assert (red - logits(png((255, 0, 0), box=60))).abs().max() > 1e-4


def test_control_tokens_in_text_are_refused(tiny_model_dir: Path) -> None:
    proc = PolicyProcessor.from_dir(tiny_model_dir)
    bad = (ChatMessage("user", (TextPart("look: <|image_pad|>"),)),)
    with pytest.raises(BadRequest, match="control token <\\|image_pad\\|>"):
        proc.encode(bad)
    with pytest.raises(BadRequest, match="image 0 is not a readable"):
        proc.encode(request(screens=(b"not a png",)).messages)


def test_weights_round_trip_through_the_folder(tiny_model_dir: Path) -> None:
    from dart_ray.models.tiny import build_model, build_tokenizer

    spec = json.loads((tiny_model_dir / "dart_ray_tiny.json").read_text())
    rebuilt = build_model(build_tokenizer(spec["vocab_size"]), TinySpec(**spec))
    loaded = load_model(tiny_model_dir)
    a, b = rebuilt.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_mrope_sections_split_half_the_head() -> None:
    assert mrope_section(128) == [16, 24, 24]  # Qwen2.5-VL-7B
    assert mrope_section(32) == [4, 6, 6]
    with pytest.raises(ValueError, match="even heads"):
        TinySpec(hidden_size=50, num_heads=2)


def test_bad_model_folders_are_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="does not exist"):
        check_model_dir(tmp_path / "nope")
    with pytest.raises(ModelDirError, match=r"has no config\.json"):
        check_model_dir(tmp_path)
    broken = tmp_path / "m"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "preprocessor_config.json").unlink()
    with pytest.raises(ModelDirError, match="no image processor"):
        check_model_dir(broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelDirError, match="no weights"):
        check_model_dir(broken)
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelDirError, match="model_type 'llama' is not supported"):
        check_model_dir(broken)


def test_resolve_model_path_builds_the_tiny_model_once(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from dart_ray.config import load_config
    from dart_ray.models import resolve_model_path

    cfg = load_config(None, [f"run.root_dir='{tmp_path}'", "run.seed=4"])
    path = resolve_model_path(cfg)
    assert path == (tmp_path / "models" / "tiny-seed4").resolve()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path(cfg) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    given = load_config(None, [f"policy.model_path='{tiny_model_dir}'"])
    assert resolve_model_path(given) == tiny_model_dir.resolve()
    with pytest.raises(ModelDirError, match="does not exist"):
        resolve_model_path(load_config(None, [f"policy.model_path='{tmp_path / 'x'}'"]))
