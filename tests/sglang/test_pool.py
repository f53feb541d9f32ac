"""OscarMHATokenToKVPool as sglang builds it: geometry and byte accounting equal PageGeometry's."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context  # noqa: E402

from oscar_ray.cache.geometry import PageGeometry  # noqa: E402
from oscar_ray.engines.sglang.pool import OscarMHATokenToKVPool, OscarPoolSpec, pool_spec  # noqa: E402
from oscar_ray.engines.sglang.settings import OscarSettings  # noqa: E402
from oscar_ray.engines.sglang.sharding import rank_rotations  # noqa: E402


def _spec(layers, heads, d, max_reqs=9, **settings):
    s = OscarSettings(rotations="identity", **settings)
    return OscarPoolSpec(s, max_reqs, rank_rotations(None, n_layers=layers, n_kv_heads=heads, head_dim=d,
                                                     tp_rank=0, tp_size=1))


def _pool(layers=3, heads=2, d=64, page=16, size=1024, spec=None, **settings):
    spec = spec or _spec(layers, heads, d, **{"sink_tokens": 16, "recent_tokens": 64, **settings})
    return OscarMHATokenToKVPool(size, page_size=page, dtype=torch.bfloat16, head_num=heads, head_dim=d,
                                 layer_num=layers, device="cpu", enable_memory_saver=False, oscar=spec)


@pytest.mark.parametrize("layers, heads, d, page, scale", [(3, 2, 64, 16, "float16"), (2, 8, 128, 64, "float32"),
                                                           (1, 3, 64, 32, "float16")])
def test_geometry_and_bytes_equal_page_geometry(layers, heads, d, page, scale):
    spec = _spec(layers, heads, d, sink_tokens=page, recent_tokens=2 * page, scale_dtype=scale)
    pool = _pool(layers, heads, d, page, size=8 * page, spec=spec)
    g = PageGeometry(layers, heads, d, page, scale_bytes=2 if scale == "float16" else 4, sink_tokens=page,
                     recent_tokens=2 * page, head_major=True)  # the default page_layout
    assert pool.geometry == g
    slots = 8 * page + page  # sglang's size + the padding page
    assert pool.k_codes[0].shape == g.int2_code_shape(slots // page)
    assert pool.k_scales[0].shape == g.int2_scale_shape(slots // page)
    assert pool.k_bf16[0].shape == g.bf16_shape(9 * 4 + 1)  # 9 request slots x (1 + 2 + 1) pages + scratch
    k_bytes, v_bytes = pool.get_kv_size_bytes()
    assert k_bytes + v_bytes == slots * g.int2_token_bytes() + pool.arena.arena_bytes()
    assert pool.arena.arena_bytes() == (9 * 4 + 1) * g.bf16_page_bytes()
    stock = MHATokenToKVPool(8 * page, page_size=page, dtype=torch.bfloat16, head_num=heads, head_dim=d,
                             layer_num=layers, device="cpu", enable_memory_saver=False)
    assert sum(stock.get_kv_size_bytes()) == slots * g.bf16_token_bytes()  # our BF16 accounting is sglang's
    assert pool.paged_kv(0).geometry().int2_page_size == page


def test_anchor_compression():
    """Qwen3-8B-like rank (36 layers, 8 KV heads, d 128): 72 B per head-layer vs 512 B, 7.1x per slot."""
    g = _pool(layers=36, heads=8, d=128, page=64, size=128, sink_tokens=64, recent_tokens=256).geometry
    assert g.int2_token_bytes() == 36 * 8 * 72 and g.bf16_token_bytes() == 36 * 8 * 512


def test_spec_scope_and_rejections():
    spec = _spec(2, 2, 64, sink_tokens=16, recent_tokens=32)
    with pytest.raises(ValueError, match="OscarPoolSpec"):
        OscarMHATokenToKVPool(256, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=64, layer_num=2,
                              device="cpu", enable_memory_saver=False)
    with pool_spec(spec):  # how the plugin's _build_token_to_kv_pool hook hands it over
        pool = OscarMHATokenToKVPool(256, page_size=16, dtype=torch.bfloat16, head_num=2, head_dim=64,
                                     layer_num=2, device="cpu", enable_memory_saver=False)
    assert pool.oscar is spec
    with pytest.raises(ValueError, match="multiple of page_size=16"):
        _pool(sink_tokens=24)
    with pytest.raises(ValueError, match="bfloat16"):
        OscarMHATokenToKVPool(256, page_size=16, dtype=torch.float16, head_num=2, head_dim=64, layer_num=2,
                              device="cpu", enable_memory_saver=False, oscar=spec)
    for call in (lambda: pool.set_kv_buffer(None, torch.zeros(1, dtype=torch.int64), None, None),
                 lambda: pool.get_cpu_copy(torch.zeros(1)), lambda: pool.move_kv_cache(None, None),
                 pool.get_contiguous_buf_infos):
        with pytest.raises(NotImplementedError):
            call()


def test_fused_kv_write_is_off_for_our_pool(plugins_loaded):
    from sglang.srt.models import utils

    from oscar_ray.engines.sglang.backend import OscarAttnBackend

    pool = _pool()
    req = ReqToTokenPool(size=8, max_context_len=128, device="cpu", enable_memory_saver=False)
    backend = OscarAttnBackend(SimpleNamespace(token_to_kv_pool=pool, req_to_token_pool=req, device="cpu"))
    with forward_context(ForwardContext(attn_backend=backend)):
        assert utils.enable_fused_set_kv_buffer(None) is False
    with pytest.raises(ValueError, match="OSCAR KV pool"):
        OscarAttnBackend(SimpleNamespace(token_to_kv_pool=object(), req_to_token_pool=req, device="cpu"))


def test_head_major_pool():
    """page_layout head: the INT2 tensors keep PageGeometry's shapes and bytes, stored [page, head,
    token, ...]; sglang's slot-row views are the same storage (its bookkeeping reads pointers and sizes)."""
    pool = _pool(layers=2, heads=2, d=64, page=16, size=8 * 16, page_layout="head")
    g, token = pool.geometry, _pool(layers=2, heads=2, d=64, page=16, size=8 * 16, page_layout="token")
    assert g.head_major and not token.geometry.head_major
    assert _pool(layers=2, heads=2, d=64, page=16, size=8 * 16).geometry.head_major  # the default
    for name in ("k_codes", "v_codes", "k_scales", "v_scales"):
        t, ref = getattr(pool, name)[0], getattr(token, name)[0]
        assert t.shape == ref.shape and t.stride(1) == t.shape[-1] and t.stride(2) == 16 * t.shape[-1], name
    assert pool.get_kv_size_bytes() == token.get_kv_size_bytes()
    assert pool.k_buffer[0].data_ptr() == pool.k_codes[0].data_ptr() and pool.k_buffer[0].is_contiguous()
    assert pool.paged_kv(0).geometry().n_kv_heads == 2


def test_three_bit_key_pool():
    """key_bits 3: key rows d/4 + d/8 bytes, value rows d/4, the bytes still those of PageGeometry."""
    pool = _pool(layers=2, heads=2, d=64, page=16, size=8 * 16, key_bits=3)
    g = pool.geometry
    assert g.key_bits == 3 and pool.k_codes[0].shape[-1] == 24 and pool.v_codes[0].shape[-1] == 16
    k_bytes, v_bytes = pool.get_kv_size_bytes()
    assert k_bytes + v_bytes == 9 * 16 * g.int2_token_bytes() + pool.arena.arena_bytes()
    assert pool.paged_kv(0).geometry().key_bits == 3
