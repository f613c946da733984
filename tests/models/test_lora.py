"""LoRA adapters: an adapter-only publish is the merged weights' function; checkpoints are
peft's adapter folder tied to their base; the trainer trains only the adapters."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
import torch

from dart_ray.config import load_config
from dart_ray.engines.hf import HFEngine
from dart_ray.models import lora
from dart_ray.models.loading import load_model
from dart_ray.models.weights import pack
from dart_ray.train.checkpointing import TrainerState, save_checkpoint
from tests.policy_helpers import GREEDY, request

SPEC = lora.AdapterSpec(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


def _trained_adapters(model_dir: Path, spec: lora.AdapterSpec = SPEC) -> torch.nn.Module:
    """The base with adapters as training leaves them: B no longer zero."""
    torch.manual_seed(1)
    model = lora.add_adapters(load_model(model_dir), spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0, 0.3)
    return model.eval()


def _logprobs(engine: HFEngine, version: int, weights) -> tuple[list[int], list[float]]:  # type: ignore[no-untyped-def]
    asyncio.run(engine.update_weights(version, weights))
    (g,) = asyncio.run(engine.generate([engine.prepare(request(), GREEDY)]))
    return list(g.response_ids), list(g.logprobs)


def test_an_adapter_publish_gives_the_merged_weights_log_probs(tiny_model_dir: Path) -> None:
    trained = _trained_adapters(tiny_model_dir)
    adapters = lora.adapter_state(trained)
    assert adapters and all(lora.is_adapter(n) for n in adapters)
    merged = lora.merged_state(trained, SPEC)
    base = load_model(tiny_model_dir).state_dict()
    assert set(merged) == set(base)
    assert not torch.equal(merged["model.language_model.layers.0.self_attn.q_proj.weight"],
                           base["model.language_model.layers.0.self_attn.q_proj.weight"])  # fmt: skip

    by_adapter, by_merge = HFEngine(tiny_model_dir), HFEngine(tiny_model_dir)
    ids_a, lp_a = _logprobs(by_adapter, 1, pack(adapters, SPEC))
    ids_m, lp_m = _logprobs(by_merge, 1, pack(merged))
    assert ids_a == ids_m and len(ids_a) > 0
    assert max(abs(a - b) for a, b in zip(lp_a, lp_m, strict=True)) < 1e-4
    # the base stayed the base: only the adapters moved, and a second version lands in place
    assert lora.has_adapters(by_adapter.model)
    layer = by_adapter.model.model.language_model.layers[0].self_attn.q_proj
    assert torch.equal(layer.base_layer.weight, base["model.language_model.layers.0.self_attn.q_proj.weight"])  # fmt: skip
    zero = {n: torch.zeros_like(t) if ".lora_B." in n else t for n, t in adapters.items()}
    plain = HFEngine(tiny_model_dir)
    assert _logprobs(by_adapter, 2, pack(zero, SPEC)) == _logprobs(plain, 1, pack(base))


def test_an_adapter_of_other_settings_is_refused_by_name(tiny_model_dir: Path) -> None:
    engine = HFEngine(tiny_model_dir)
    asyncio.run(engine.update_weights(1, pack(lora.adapter_state(_trained_adapters(tiny_model_dir)), SPEC)))  # fmt: skip
    other = lora.AdapterSpec(rank=4, alpha=8.0, target_modules=("o_proj",))
    wrong = lora.adapter_state(lora.add_adapters(load_model(tiny_model_dir), other))
    with pytest.raises(lora.AdapterError, match=r"other train\.lora settings"):
        asyncio.run(engine.update_weights(2, pack(wrong, other)))


def test_a_lora_checkpoint_is_peft_s_folder_tied_to_its_base(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    base_dir = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base_dir)
    trained = _trained_adapters(base_dir)
    out = save_checkpoint(
        tmp_path / "v3", trained, lora.adapter_state(trained), None, base_dir,
        TrainerState(step=3, version=3), SPEC,
    )  # fmt: skip
    assert not (out / "model.safetensors").exists()  # adapters only
    assert (out / "adapter_model.safetensors").stat().st_size < 0.1 * (
        base_dir / "model.safetensors"
    ).stat().st_size
    # dart-ray's loader (eval, the policy server) applies them to the base ...
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    want = trained(input_ids=ids).logits
    assert torch.allclose(load_model(out)(input_ids=ids).logits, want, atol=1e-5)
    # ... and so does peft's own, from the same folder
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(load_model(base_dir), str(out)).eval()
    assert torch.allclose(peft_model(input_ids=ids).logits, want, atol=1e-5)
    # a resumed run saving again keeps the original base's identity
    again = save_checkpoint(
        tmp_path / "v4", trained, lora.adapter_state(trained), None, out,
        TrainerState(step=4, version=4), SPEC,
    )  # fmt: skip
    assert lora.base_folder(again) == base_dir.resolve()
    # other base weights under the same path: refused by name
    lora.weights_digest.cache_clear()
    other = load_model(base_dir)
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    other.save_pretrained(base_dir)
    with pytest.raises(lora.AdapterError, match="not the one these adapters were trained on"):
        load_model(out)
    lora.weights_digest.cache_clear()


def test_train_lora_is_configured_and_checked() -> None:
    cfg = load_config(None, ["train.lora.enabled=true", "train.lora.rank=8"])
    spec = lora.adapter_spec(cfg.train.lora)
    assert spec is not None and spec.rank == 8 and spec.scaling == 64 / 8
    assert lora.adapter_spec(load_config(None, []).train.lora) is None
    with pytest.raises(Exception, match=r"needs policy\.vllm_max_lora_rank >= 8 \(got 0\)"):
        load_config(None, ["train.lora.enabled=true", "train.lora.rank=8", "policy.engine=vllm"])
    load_config(None, ["train.lora.enabled=true", "policy.engine=vllm", "policy.vllm_max_lora_rank=32"])  # fmt: skip


def test_adapters_take_the_model_s_dtype(tiny_model_dir: Path) -> None:
    """peft would upcast adapters of a bf16 model to float32: twice the bytes per publish."""
    model = lora.add_adapters(load_model(tiny_model_dir, dtype=torch.bfloat16), SPEC)
    assert {t.dtype for t in lora.adapter_state(model).values()} == {torch.bfloat16}
