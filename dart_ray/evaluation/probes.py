"""Probes: where does a policy lose the binding between the named label and the button?

On the four-button grounding suite the warm start clicks *a* button but the *named* one
barely above chance, and RL does not form the binding (docs/LEARNING.md). Three questions,
each answered by a measurement on the same screens (issue 17, part 3):

1. **Vision**: is the button's label decodable from the image tokens that cover it? A linear
   probe from the merged vision tokens at the button to its label, trained on training
   screens and scored on held-out ones; the same probe on the button's raw pixels says
   whether the label is legible at this resolution at all.
2. **Language**: at the position where the policy writes the first coordinate digit (the
   oracle's response teacher-forced), does the hidden state know *which* button is the
   target? A linear probe from each layer's hidden state to the target's index (buttons
   ordered top-left to bottom-right: 4 classes), and to the named label.
3. **Attention**: from that position, how much of each layer's attention over image tokens
   falls on the target's tokens, against the other buttons' tokens and against their share
   of the image?

Probes are multinomial logistic regressions fitted by full-batch gradient descent with an
L2 penalty (`fit_probe`), standardised on the training features; accuracy is on held-out
screens. Run with `scripts/probe_binding.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dart_ray.config import EnvConfig
from dart_ray.models.loading import PolicyProcessor, image_inputs
from dart_ray.records import Task
from dart_ray.uitars.prompts import Turn, build_messages

MERGE_PX = 28
"""Pixels per side of one merged image token (14 px patches, 2x2 merge)."""


@dataclass(frozen=True)
class Button:
    label: str
    cell: int
    """Index, among the image tokens, of the token that covers the button's centre."""
    pixels: torch.Tensor
    """The button's pixels, resized to a fixed 12x32 grey crop (for the pixel baseline)."""


@dataclass(frozen=True)
class Screen:
    """What the probes read from one screen."""

    buttons: tuple[Button, ...]
    """Ordered top-left to bottom-right (by row, then column)."""
    target: int
    """Index into `buttons` of the one the instruction names."""
    vision: torch.Tensor
    """(image tokens, hidden) merged vision tokens, as the language model receives them."""
    hidden: torch.Tensor
    """(layers + 1, hidden) hidden states at the position that predicts the first coordinate
    digit (the embeddings, then each layer's output)."""
    image_attention: torch.Tensor
    """(layers, image tokens) attention from that position to each image token, summed over
    heads and normalised over the image tokens."""


def first_coordinate_index(processor: PolicyProcessor, response_ids: Sequence[int]) -> int:
    """Index in `response_ids` of the token that holds the first coordinate digit."""
    marker = "start_box='("
    for k in range(len(response_ids)):
        text = processor.decode(response_ids[: k + 1])
        at = text.find(marker)
        if at >= 0 and len(text) > at + len(marker) and text[at + len(marker)].isdigit():
            return k
    raise ValueError(f"no coordinate in {processor.decode(response_ids)!r}")


def _crop(png: bytes, x: int, y: int, w: int, h: int) -> torch.Tensor:
    import io

    from PIL import Image

    im = Image.open(io.BytesIO(png)).convert("L").crop((x, y, x + w, y + h)).resize((32, 12))
    return torch.tensor(list(im.getdata()), dtype=torch.float32) / 255.0


@torch.no_grad()
def read_screens(
    model: torch.nn.Module, processor: PolicyProcessor, env_config: EnvConfig, tasks: Sequence[Task]
) -> list[Screen]:
    """Reset MiniDesk on each task, teacher-force the oracle's first response, read the probes'
    inputs. Tasks must be click-button screens (every widget a button)."""
    from dart_ray.warmstart.writers import OracleWriter

    oracle = OracleWriter(processor, env_config)
    env = oracle.env
    screens = []
    for task in tasks:
        obs = env.reset(task)
        action, _, response = oracle.next_response()
        enc = processor.encode(build_messages(task.instruction, [Turn(obs.screenshot)]))
        k = first_coordinate_index(processor, response)
        ids = torch.tensor([list(enc.input_ids) + list(response)])
        out = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            **image_inputs(ids, enc.pixel_values, enc.image_grid_thw, processor.image_pad_id),
            output_hidden_states=True,
            output_attentions=True,
        )
        pos = len(enc.input_ids) + k - 1  # its logits predict the digit
        image = (ids[0] == processor.image_pad_id).nonzero()[:, 0]
        (mw, mh) = enc.model_sizes[0]
        cols = mw // MERGE_PX
        sx, sy = mw / env_config.screen_width, mh / env_config.screen_height
        widgets = sorted(env.scene.widgets.values(), key=lambda w: (w.rect.y, w.rect.x))
        if any(w.kind != "button" for w in widgets):
            raise ValueError(f"{task.task_id}: the probes read click-button screens only")
        buttons = []
        for w in widgets:
            r = w.rect
            cx, cy = (r.x + r.w / 2) * sx, (r.y + r.h / 2) * sy
            cell = int(cy // MERGE_PX) * cols + int(cx // MERGE_PX)
            buttons.append(Button(w.label, cell, _crop(obs.screenshot, r.x, r.y, r.w, r.h)))
        target = next(i for i, w in enumerate(widgets) if w.rect.contains(*action.point))  # type: ignore[misc]
        att = torch.stack([a[0, :, pos, image].sum(0) for a in out.attentions])  # (L, image)
        vision = model.model.visual(enc.pixel_values, grid_thw=enc.image_grid_thw).pooler_output
        screens.append(
            Screen(
                buttons=tuple(buttons),
                target=target,
                vision=vision.float(),
                hidden=torch.stack([h[0, pos] for h in out.hidden_states]).float(),
                image_attention=att / att.sum(-1, keepdim=True),
            )
        )
    return screens


def fit_probe(
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    x_test: torch.Tensor,
    y_test: torch.Tensor,
    classes: int,
    *,
    l2: float = 1e-3,
    steps: int = 500,
    lr: float = 0.5,
) -> float:
    """Held-out accuracy of a multinomial logistic regression from x to y (pure torch)."""
    mean, std = x_train.mean(0), x_train.std(0).clamp_min(1e-6)
    xtr, xte = (x_train - mean) / std, (x_test - mean) / std
    w = torch.zeros(xtr.shape[1], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=lr, max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xtr @ w + b, y_train) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return float(((xte @ w + b).argmax(-1) == y_test).float().mean())


def _majority(y_train: torch.Tensor, y_test: torch.Tensor) -> float:
    return float((y_test == torch.mode(y_train).values).float().mean())


def run_probes(train: Sequence[Screen], test: Sequence[Screen]) -> dict[str, object]:
    """Every probe's held-out accuracy (with its chance level) and the attention shares."""
    labels = sorted({b.label for s in [*train, *test] for b in s.buttons})
    index = {label: i for i, label in enumerate(labels)}

    def per_button(screens: Sequence[Screen]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        vis = torch.stack([s.vision[b.cell] for s in screens for b in s.buttons])
        pix = torch.stack([b.pixels for s in screens for b in s.buttons])
        y = torch.tensor([index[b.label] for s in screens for b in s.buttons])
        return vis, pix, y

    vtr, ptr, ytr = per_button(train)
    vte, pte, yte = per_button(test)
    n = len(labels)
    result: dict[str, object] = {
        "labels": n,
        "train_screens": len(train),
        "test_screens": len(test),
        "vision_label": {
            "vision_tokens": fit_probe(vtr, ytr, vte, yte, n),
            "raw_pixels": fit_probe(ptr, ytr, pte, yte, n),
            "majority": _majority(ytr, yte),
        },
    }
    ttr = torch.tensor([s.target for s in train])
    tte = torch.tensor([s.target for s in test])
    ltr = torch.tensor([index[s.buttons[s.target].label] for s in train])
    lte = torch.tensor([index[s.buttons[s.target].label] for s in test])
    layers = train[0].hidden.shape[0]
    result["language"] = [
        {
            "layer": layer,
            "target_index": fit_probe(
                torch.stack([s.hidden[layer] for s in train]),
                ttr,
                torch.stack([s.hidden[layer] for s in test]),
                tte,
                4,
            ),
            "target_label": fit_probe(
                torch.stack([s.hidden[layer] for s in train]),
                ltr,
                torch.stack([s.hidden[layer] for s in test]),
                lte,
                n,
            ),
        }
        for layer in range(layers)
    ]
    result["language_chance"] = {
        "target_index": _majority(ttr, tte),
        "target_label": _majority(ltr, lte),
    }
    screens = [*train, *test]
    attention = []
    for layer in range(screens[0].image_attention.shape[0]):
        on_target = on_others = share_target = share_others = 0.0
        for s in screens:
            a = s.image_attention[layer]
            cells = [b.cell for b in s.buttons]
            others = {c for i, c in enumerate(cells) if i != s.target and c != cells[s.target]}
            on_target += float(a[cells[s.target]])
            on_others += float(sum(a[c] for c in others)) / max(len(others), 1)
            share_target += 1 / len(a)
            share_others += 1 / len(a)
        k = len(screens)
        attention.append({
            "layer": layer,
            "on_target_cell": on_target / k,
            "on_each_other_button_cell": on_others / k,
            "uniform_cell": share_target / k,
        })  # fmt: skip
    result["attention"] = attention
    return result
