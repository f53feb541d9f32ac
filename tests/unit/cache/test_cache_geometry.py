"""PageGeometry: validation, shapes, byte accounting, tokens_that_fit, the docs table."""

from pathlib import Path

import pytest

from oscar_ray.cache import (
    PageGeometry, PageKind, format_capacity_table, reference_geometries,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "cache.md"
GIB = 2**30


def one_head(head_dim=128, **kw):
    """One layer, one KV head, one token per page: page bytes = bytes per token*head*layer."""
    return PageGeometry(1, 1, head_dim, 1, sink_tokens=0, recent_tokens=0, **kw)


def test_anchor_head_dim_128_fp16_scales():
    g = one_head()
    assert g.int2_code_shape(1)[-1] == 32  # 128 codes / 4 per byte = 32 B per K or V
    assert g.int2_scale_shape(1)[-1] == 2  # one group: scale + zero
    assert g.int2_page_bytes() == 72  # K+V: 2 * (32 + 2 * 2)
    assert g.bf16_page_bytes() == 512  # K+V: 2 * 128 * 2
    assert round(g.bf16_page_bytes() / g.int2_page_bytes(), 1) == 7.1


def test_anchor_head_dim_128_fp32_scales():
    g = one_head(scale_bytes=4)
    assert g.int2_page_bytes() == 80  # K+V: 2 * (32 + 2 * 4)
    assert g.bf16_page_bytes() / g.int2_page_bytes() == pytest.approx(6.4)


def test_group_size_default_and_smaller_groups():
    assert one_head().group_size == 128
    assert one_head() == one_head(group_size=128)  # None resolves, equal geometries compare equal
    g = one_head(group_size=32)  # 4 groups: 4 scales + 4 zeros of 2 B per K or V
    assert g.groups == 4 and g.int2_scale_shape(7) == (7, 1, 1, 8)
    assert g.int2_page_bytes() == 2 * (32 + 16)


def test_three_bit_keys():
    g = one_head(key_bits=3)  # keys 32 B + a 16 B bit plane + 4 B scales, values 36 B
    assert g.key_code_shape(5) == (5, 1, 1, 48) and g.int2_code_shape(5) == (5, 1, 1, 32)
    assert g.int2_page_bytes() == 88 and round(g.bf16_page_bytes() / g.int2_page_bytes(), 1) == 5.8
    small = one_head(head_dim=64, key_bits=3)  # SmolLM2: 24 + 4 + 16 + 4 = 48 B vs 40 B at INT2 keys
    assert small.int2_page_bytes() == 48 and one_head(head_dim=64).int2_page_bytes() == 40
    assert one_head().key_code_shape(2) == one_head().int2_code_shape(2)


def test_page_bytes_cover_all_layers_heads_and_tokens():
    g = PageGeometry(36, 8, 128, 64)  # Qwen3-8B
    assert g.bf16_page_bytes() == 64 * 36 * 8 * 512
    assert g.int2_page_bytes() == 64 * 36 * 8 * 72
    assert g.bf16_shape(10) == (10, 64, 8, 128)
    assert g.int2_code_shape(10) == (10, 64, 8, 32)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(n_layers=0), "n_layers"),
        (dict(n_kv_heads=-1), "n_kv_heads"),
        (dict(head_dim=66), "head_dim"),
        (dict(page_size=0), "page_size"),
        (dict(group_size=48), "group_size"),
        (dict(scale_bytes=8), "scale_bytes"),
        (dict(sink_tokens=10), "sink_tokens"),
        (dict(recent_tokens=100), "recent_tokens"),
        (dict(recent_tokens=-64), "recent_tokens"),
        (dict(n_layers=2.0), "n_layers"),
        (dict(key_bits=4), "key_bits"),
        (dict(key_bits=True), "key_bits"),
        (dict(key_bits=3, head_dim=4), "key_bits"),
        (dict(head_major="head"), "head_major"),
    ],
)
def test_validation_names_the_parameter(kwargs, name):
    args = dict(n_layers=2, n_kv_heads=2, head_dim=128, page_size=64) | kwargs
    with pytest.raises(ValueError, match=name):
        PageGeometry(**args)


def test_zero_sink_and_recent_allowed_and_frozen():
    g = PageGeometry(2, 2, 64, 16, sink_tokens=0, recent_tokens=0)
    assert g.sink_pages == 0 and g.recent_pages == 0
    with pytest.raises(AttributeError):
        g.page_size = 32


def test_layout_rule():
    g = PageGeometry(1, 1, 8, 4, sink_tokens=8, recent_tokens=8)  # 2 sink pages, 2 ring pages
    B, I = PageKind.BF16, PageKind.INT2
    assert g.layout(5) == [B, B]
    assert g.layout(16) == [B, B, B, B]  # 4 full pages: 2 sink + 2 ring, nothing to demote
    assert g.layout(19) == [B, B, B, B, B]  # + partial tail: ring = 2 full + tail
    assert g.layout(20) == [B, B, I, B, B]  # 5 full pages: the oldest ring page went INT2
    assert g.layout(41) == [B, B, I, I, I, I, I, I, B, B, B]


def test_bytes_per_token_bf16_inside_window_and_int2_beyond():
    g = PageGeometry(36, 8, 128, 64)
    short = g.bytes_per_token(320)  # sink 64 + recent 256: all BF16
    assert short.bf16 == short.oscar == g.bf16_token_bytes()
    cost = g.context_bytes(32 * 1024)
    assert cost.oscar == 320 * g.bf16_token_bytes() + (32 * 1024 - 320) * g.int2_token_bytes()
    per_token = g.bytes_per_token(128 * 1024)
    assert g.int2_token_bytes() < per_token.oscar < g.bf16_token_bytes()
    assert 6.9 < per_token.compression < 512 / 72
    with pytest.raises(ValueError, match="context_len"):
        g.bytes_per_token(0)


def test_tokens_that_fit():
    g = PageGeometry(36, 8, 128, 64)
    bf16, int2, window = g.bf16_token_bytes(), g.int2_token_bytes(), 320
    assert g.tokens_that_fit(0).oscar == 0
    small = g.tokens_that_fit(100 * bf16 + 5)  # ends inside the BF16 window: same as BF16
    assert small.bf16 == small.oscar == 100
    exact = g.tokens_that_fit(window * bf16)
    assert exact.bf16 == exact.oscar == window
    budget = 16 * GIB
    fit = g.tokens_that_fit(budget)
    assert fit.bf16 == budget // bf16
    assert fit.oscar == window + (budget - window * bf16) // int2
    assert g.context_bytes(fit.oscar).oscar <= budget < g.context_bytes(fit.oscar + 1).oscar
    assert fit.gain > 7.0
    with pytest.raises(ValueError, match="budget_bytes"):
        g.tokens_that_fit(-1)


def test_capacity_table_rows_and_docs_in_sync():
    table = format_capacity_table(reference_geometries(), 64 * GIB)
    rows = table.splitlines()[2:]
    assert len(rows) == 3 * 2 * 2  # models x scale widths x contexts
    assert rows[4].startswith("| Qwen3-8B | fp16 | 32K | 4.50 |")
    stale = "docs/cache.md is stale: paste the output of format_capacity_table"
    assert table in DOCS.read_text(encoding="utf-8"), stale
