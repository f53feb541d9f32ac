"""The torch engine's CUDA path (Triton kernels) on a tiny random Qwen3: the decode steps' fused ring
write must give the same tokens and logits as writing the ring first; skipped without CUDA."""

import pytest
import torch

pytest.importorskip("pydantic")  # the engine config; the GPU image gets the wheels carried

from oscar_ray.engines.torch import TorchEngineConfig  # noqa: E402
from oscar_ray.engines.torch import batch as batch_mod  # noqa: E402
from oscar_ray.engines.torch.core import EngineCore  # noqa: E402
from oscar_ray.engines.torch.scheduler import Seq  # noqa: E402

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _core(fused: bool, monkeypatch) -> EngineCore:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    plan = batch_mod.StepBatch._plan_cuda

    def planned(self):
        plan(self)
        self.fused_append = self.fused_append and fused

    monkeypatch.setattr(batch_mod.StepBatch, "_plan_cuda", planned)
    # page 8, sink 16, recent 32: a 90-token prompt has INT2 history and the decode steps demote
    tcfg = TorchEngineConfig(model="random-qwen3", kv_cache="oscar", rotations="hadamard", max_model_len=512,
                             kv_cache_bytes=64 << 20, max_num_seqs=4, max_batched_tokens=128, prefix_caching=False,
                             device=CUDA, dtype="bfloat16",
                             cache={"page_size": 8, "sink_tokens": 16, "recent_tokens": 32})
    return EngineCore(tcfg, model, None)


def _run(core: EngineCore, steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    seqs = [Seq(f"r{i}", torch.randint(0, 256, (n,), generator=gen).tolist(), n, steps + 1)
            for i, n in enumerate((90, 10, 47))]  # history + ring, sink only, sink + ring
    for s in seqs:
        core.scheduler.add(s)
    logits = []
    for _ in range(steps + 2):  # prefill chunks first, then decodes
        result = core.step()
        for seq, lg in result.sampled:
            seq.tokens.append(int(lg.argmax()))
            logits.append(lg.float().cpu())
        core.finish_step([], [])
    return [s.tokens for s in seqs], logits


def test_fused_ring_write_equals_write_then_decode(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    used = []
    decode = batch_mod._decode

    def counting(q, kv, seg, max_int2, max_bf16, append=None):
        used.append(append is not None)
        return decode(q, kv, seg, max_int2, max_bf16, append)

    monkeypatch.setattr(batch_mod, "_decode", counting)
    fused_tokens, fused_logits = _run(_core(True, monkeypatch), 24)
    assert any(used), "no decode step took the fused path"
    used.clear()
    plain_tokens, plain_logits = _run(_core(False, monkeypatch), 24)
    assert not any(used)
    assert fused_tokens == plain_tokens
    for a, b in zip(fused_logits, plain_logits):
        assert torch.equal(a, b)
