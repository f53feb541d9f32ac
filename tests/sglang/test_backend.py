"""The OSCAR backend and pool through sglang's own objects: slots from PagedTokenToKVPoolAllocator,
rows of ReqToTokenPool, ForwardBatch, RadixAttention, AttentionBackend.forward's dispatch; the
kernels on Triton's interpreter.  Each forward is checked twice: the tier of every cached token
(hand-derived from PageGeometry's rule and prefix ownership) and the attention output against an
fp64 reference that quantises exactly those tokens (quant.int2) and keeps the rest in BF16.
"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402

from oscar_ray.engines.sglang.backend import OscarAttnBackend  # noqa: E402
from oscar_ray.engines.sglang.pool import OscarMHATokenToKVPool, OscarPoolSpec  # noqa: E402
from oscar_ray.engines.sglang.settings import OscarSettings  # noqa: E402
from oscar_ray.engines.sglang.sharding import RankRotations  # noqa: E402
from oscar_ray.quant.attention import reference_attention  # noqa: E402
from oscar_ray.quant.clip import clip_rows  # noqa: E402
from oscar_ray.quant.int2 import dequantize_int2, quantize_int2  # noqa: E402

P, D, HQ, HKV, LAYERS = 16, 64, 4, 2, 2
CLIP = (0.96, 0.92)


def _orthogonal(*shape):
    q, _ = torch.linalg.qr(torch.randn(*shape, dtype=torch.float64))
    return q.float()


class World:
    """One sglang rank's cache objects with the OSCAR pool: sink 1 page, recent 2 pages (default)."""

    def __init__(self, page_layout="token", recent_pages=2):
        settings = OscarSettings(rotations="per-head test rotations", sink_tokens=P, recent_tokens=recent_pages * P,
                                 page_layout=page_layout)
        self.r_k = _orthogonal(LAYERS, HKV, D, D)
        rot = RankRotations(0, self.r_k, _orthogonal(LAYERS, HKV, D, D), (CLIP[0],) * LAYERS, (CLIP[1],) * LAYERS)
        self.req_pool = ReqToTokenPool(size=4, max_context_len=256, device="cpu", enable_memory_saver=False)
        spec = OscarPoolSpec(settings, self.req_pool.req_to_token.shape[0], rot)
        self.pool = OscarMHATokenToKVPool(size=512, page_size=P, dtype=torch.bfloat16, head_num=HKV, head_dim=D,
                                          layer_num=LAYERS, device="cpu", enable_memory_saver=False, oscar=spec)
        self.alloc = PagedTokenToKVPoolAllocator(512, P, torch.bfloat16, "cpu", self.pool, False)
        runner = SimpleNamespace(token_to_kv_pool=self.pool, req_to_token_pool=self.req_pool, device="cpu")
        self.backend = OscarAttnBackend(runner)
        self.layers = [RadixAttention(HQ, D, D**-0.5, HKV, layer_id=i) for i in range(LAYERS)]
        self.kv = {}  # req slot → per layer (k, v) float32 [n, HKV, D] of every cached position
        self.lens = {}

    def grow(self, req, n_new, share=None):
        """Slots for n_new more tokens (whole new pages, as sglang's paged allocator hands out)."""
        start = self.lens.get(req, 0)
        if share is not None:
            src, pages = share
            start = pages * P
            self.req_pool.req_to_token[req, :start] = self.req_pool.req_to_token[src, :start]
            self.kv[req] = [(k[:start].clone(), v[:start].clone()) for k, v in self.kv[src]]
        end = start + n_new
        first_new_page = -(-start // P)
        need = -(-end // P) - first_new_page
        if need:
            slots = self.alloc.alloc(need * P)
            self.req_pool.req_to_token[req, first_new_page * P:(first_new_page + need) * P] = slots.to(torch.int32)
        self.lens[req] = end
        return start, end

    def forward(self, mode, reqs, n_new, shares=None, host_lens=True):
        """Run one batch: every layer through AttentionBackend.forward; returns per layer
        (q, k, v, output) and the per-request (prefix or cache) lengths.  host_lens False: no
        seq_lens_cpu (a ForwardBatch built without the host copy)."""
        shares = shares or {}
        spans = [self.grow(r, n, shares.get(r)) for r, n in zip(reqs, n_new)]
        loc = torch.cat([self.req_pool.req_to_token[r, s:e].long() for r, (s, e) in zip(reqs, spans)])
        pos = torch.cat([torch.arange(s, e) for s, e in spans])
        t = loc.shape[0]
        seq = torch.tensor([e for _, e in spans])
        fb = ForwardBatch(forward_mode=mode, batch_size=len(reqs), input_ids=torch.zeros(t, dtype=torch.int64),
                          req_pool_indices=torch.tensor(reqs), seq_lens=seq, out_cache_loc=loc,
                          seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.clone() if host_lens else None,
                          positions=pos)
        if mode == ForwardMode.EXTEND:
            fb.extend_seq_lens = torch.tensor(n_new, dtype=torch.int32)
            fb.extend_prefix_lens = torch.tensor([s for s, _ in spans], dtype=torch.int32)
            fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = list(n_new), [s for s, _ in spans]
        self.backend.init_forward_metadata(fb)
        out = []
        for layer in self.layers:
            q = torch.randn(t, HQ * D).to(torch.bfloat16)
            k, v = (torch.randn(t, HKV, D).to(torch.bfloat16) for _ in range(2))
            o = self.backend.forward(q, k, v, layer, fb)
            out.append((q, k, v, o))
            for b, (r, (s, e)) in enumerate(zip(reqs, spans)):
                rows = slice(int(sum(n_new[:b])), int(sum(n_new[: b + 1])))
                old = self.kv.setdefault(r, [(torch.empty(0, HKV, D), torch.empty(0, HKV, D))] * LAYERS)
                ko, vo = old[layer.layer_id]
                old = list(old)
                old[layer.layer_id] = (torch.cat([ko[:s], k[rows].float()]), torch.cat([vo[:s], v[rows].float()]))
                self.kv[r] = old
        return spans, out, self.backend.forward_metadata.segments


def _tiered(x, r, clip, bf16_mask, via_bf16=None):
    """Cached rows [n, HKV, D] as the pool serves them, in the rotated basis: BF16 where bf16_mask,
    else INT2 (clip → quantise → dequantise, fp16 scales, one group per row), quantised from the
    rows rounded to bf16 where via_bf16 (pages a decode step completed: codes from the arena copy)."""
    xr = x.double() if r is None else torch.einsum("nhi,hij->nhj", x.double(), r.double())
    src = xr.float()
    if via_bf16 is not None:
        src = torch.where(via_bf16[:, None, None], src.to(torch.bfloat16).float(), src)
    codes, scales = quantize_int2(clip_rows(src, clip), None, "float16")
    deq = dequantize_int2(codes, scales, None).double()
    return torch.where(bf16_mask[:, None, None], xr.float().to(torch.bfloat16).double(), deq)


def _spans_mask(n, spans):
    mask = torch.zeros(n, dtype=torch.bool)
    for lo, hi in spans:
        mask[lo:hi] = True
    return mask


def _check(world, reqs, spans, out, seg, bf16_sets, decode, via_bf16_sets=None):
    for b, (req, (start, end)) in enumerate(zip(reqs, spans)):
        n_cached = end if decode else start
        mask = _spans_mask(n_cached, bf16_sets[b])
        via = _spans_mask(n_cached, via_bf16_sets[b] if via_bf16_sets else [])
        assert (int(seg.bf16_lens[b]), int(seg.int2_lens[b])) == (int(mask.sum()), n_cached - int(mask.sum()))
        rows = slice(sum(e - s for s, e in spans[:b]), sum(e - s for s, e in spans[: b + 1]))
        for layer_id, (q, k, v, o) in enumerate(out):
            r_k = world.r_k[layer_id]
            kc, vc = world.kv[req][layer_id]
            keys = _tiered(kc[:n_cached], r_k, CLIP[0], mask, via)
            vals = _tiered(vc[:n_cached], None, CLIP[1], mask, via)  # V absorbed: stored as given
            qr = torch.einsum("nhgi,hij->nhgj", q[rows].double().reshape(-1, HKV, HQ // HKV, D), r_k.double())
            qr = qr.reshape(-1, HQ, D)
            if not decode:  # the chunk itself attends at full precision, causally
                k_new = torch.einsum("nhi,hij->nhj", k[rows].double(), r_k.double())
                keys, vals = torch.cat([keys, k_new]), torch.cat([vals, v[rows].double()])
            ref = reference_attention(qr, keys, vals, causal=not decode)
            got = o[rows].double().reshape(-1, HQ, D)
            # all-BF16 reading of the same cache: a wrong tier moves the output by about this much
            alt_keys = _tiered(kc[:n_cached], r_k, CLIP[0], torch.ones_like(mask))
            alt_vals = _tiered(vc[:n_cached], None, CLIP[1], torch.ones_like(mask))
            if not decode:
                alt_keys, alt_vals = torch.cat([alt_keys, keys[n_cached:]]), torch.cat([alt_vals, vals[n_cached:]])
            alt = reference_attention(qr, alt_keys, alt_vals, causal=not decode)
            err = (got - ref).abs().max().item()
            # bf16 dot operands, which the Triton interpreter truncates instead of rounding (the kernel
            # unit tests allow 3e-2 for bf16 too); 2e-2 failed ~1 seed in 5 on the first prefill
            # (OSCAR_TEST_SEED=242950331: 0.0248), before and after the 2026-12-04 kernel changes
            assert err < 3e-2, f"request slot {req}, layer {layer_id}: max error {err}"
            if not mask.all():
                assert err < 0.25 * (alt - ref).abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("extend_method, page_layout", [("auto", "token"), ("dequant", "token"), ("auto", "head")])
def test_chunked_prefill_decode_ring_wrap_and_prefix_hit(seed, extend_method, page_layout):
    # auto is the fused extend kernel on CPU; head: the INT2 pages stored head-major (same answers)
    w = World(page_layout)
    assert w.pool.k_codes[0].stride(1) == (D // 4 if page_layout == "head" else HKV * D // 4)
    w.backend.extend_method = extend_method  # dequant: the CUDA default, fed the metadata's host lengths
    a, b = 1, 2
    # A: two prefill chunks (40 + 55), windows at 95: sink page 0 + pages 3..5 ...
    spans, out, seg = w.forward(ForwardMode.EXTEND, [a], [40])
    _check(w, [a], spans, out, seg, [[]], decode=False)
    spans, out, seg = w.forward(ForwardMode.EXTEND, [a], [55])
    # ... so chunk 2 reads its prefix: page 0 BF16; pages 1..2 INT2 (their ring pages now hold 4..5)
    _check(w, [a], spans, out, seg, [[(0, 16)]], decode=False)
    # decode at 95 (n 96: window 0, 4, 5) and at 96 (n 97: page 6 takes page 3's ring page)
    spans, out, seg = w.forward(ForwardMode.DECODE, [a], [1])
    _check(w, [a], spans, out, seg, [[(0, 16), (64, 96)]], decode=True)
    spans, out, seg = w.forward(ForwardMode.DECODE, [a], [1])
    _check(w, [a], spans, out, seg, [[(0, 16), (64, 97)]], decode=True)
    # B: a radix-cache hit on A's first 3 pages (slot ids shared, BF16 copies not): prefix all INT2
    spans, out, seg = w.forward(ForwardMode.EXTEND, [b], [20], shares={b: (a, 3)})
    _check(w, [b], spans, out, seg, [[]], decode=False)
    # A and B decode in one batch: B's own pages 3..4 are BF16, its shared ones INT2
    spans, out, seg = w.forward(ForwardMode.DECODE, [a, b], [1, 1])
    _check(w, [a, b], spans, out, seg, [[(0, 16), (64, 98)], [(48, 69)]], decode=True)


@pytest.mark.parametrize("page_layout, form", [("token", "launch"), ("head", "launch"), ("head", "separate"),
                                               ("head", "side"), ("token", "auto"), ("head", "rotate"),
                                               ("token", "rotate")])
def test_decode_step_writes_the_new_token_by_its_form(seed, page_layout, form):
    # "launch": decode writes nothing before attending: its launch stores the step's token rotated
    # into the window (BF16) and into its own slot (INT2); "separate": the write launches do both
    # first; "side": on a second stream (without CUDA in series) the BF16 copy only, as the
    # token does not complete its page (41 tokens: page 2 holds 32..40), the attention taking the
    # token from its rows; "rotate" (auto): that BF16 copy by the q rotation's launch, read from its slot.  The copies a form writes must equal the write kernels' result for those
    # rows, and the attention read the tiers' tokens (all BF16 at 41: sink page 0, recent pages 1..2)
    from oscar_ray.kernels import bf16_write_kv, int2_write_kv

    w = World(page_layout)
    w.backend.decode_write = form
    a = 1
    w.forward(ForwardMode.EXTEND, [a], [40])
    before = [t[layer].clone() for layer in range(LAYERS)
              for t in (w.pool.k_codes, w.pool.k_scales, w.pool.v_codes, w.pool.v_scales)]
    spans, out, seg = w.forward(ForwardMode.DECODE, [a], [1])
    _check(w, [a], spans, out, seg, [[(0, 41)]], decode=True)
    fills = w.backend.forward_metadata.fills  # planned for the side form only, empty at 41 tokens
    assert fills is None if form in ("launch", "separate") else fills.count == 0
    loc = int(w.req_pool.req_to_token[a, 40])
    page, off = torch.tensor([loc // P], dtype=torch.int32), torch.tensor([loc % P], dtype=torch.int32)
    ring = int(w.backend.forward_metadata.plan.bf16_page[0])
    for layer in range(LAYERS):
        k, v = (x[40:41] for x in w.kv[a][layer])
        r_k, _, k_clip, v_clip = w.pool.rotations.layer(layer)
        kc, ks, vc, vs = before[4 * layer: 4 * layer + 4]
        if form in ("launch", "separate"):  # the token's own INT2 slot, every step
            kc, ks, vc, vs = (t.clone() for t in (kc, ks, vc, vs))
            int2_write_kv(k, v, r_k, None, k_clip, v_clip, page, off, kc, ks, vc, vs)
            assert w.pool.k_codes[layer][loc // P, loc % P].any()  # written, not left as allocated
        kb, vb = w.pool.k_bf16[layer].clone(), w.pool.v_bf16[layer].clone()
        bf16_write_kv(k, v, r_k, None, torch.tensor([ring], dtype=torch.int32), off, kb, vb)
        assert torch.equal(w.pool.k_codes[layer], kc) and torch.equal(w.pool.v_codes[layer], vc), layer
        assert torch.equal(w.pool.k_scales[layer], ks) and torch.equal(w.pool.v_scales[layer], vs), layer
        assert torch.equal(w.pool.k_bf16[layer], kb) and torch.equal(w.pool.v_bf16[layer], vb), layer


@pytest.mark.parametrize("page_layout, form", [("token", "side"), ("head", "side"), ("head", "rotate")])
def test_side_decode_writes_a_page_s_int2_codes_when_it_fills_and_a_prefix_hit_reads_them(seed, page_layout, form):
    # "side" (and "rotate") write INT2 codes once per page: the step whose token completes page 2 (48 tokens)
    # quantises the page's arena copy into its slot page (demote_pages_kv), overwriting the codes
    # the extend wrote for 32..45; request B then shares A's three pages through the radix cache
    # and reads all of them from INT2, page 2 included: codes missing or wrong there move its output
    from oscar_ray.kernels import demote_pages_kv

    w = World(page_layout)
    w.backend.decode_write = form
    a, b = 1, 2
    w.forward(ForwardMode.EXTEND, [a], [46])
    spans, out, seg = w.forward(ForwardMode.DECODE, [a], [1])  # 47 tokens: no page completed
    _check(w, [a], spans, out, seg, [[(0, 47)]], decode=True)
    slot_page = int(w.req_pool.req_to_token[a, 32]) // P
    arena_page = int(w.backend.forward_metadata.plan.bf16_page[0])
    k_kept = [w.pool.k_codes[layer][slot_page].clone() for layer in range(LAYERS)]
    spans, out, seg = w.forward(ForwardMode.DECODE, [a], [1])  # 48: page 2 complete
    _check(w, [a], spans, out, seg, [[(0, 48)]], decode=True)
    fills = w.backend.forward_metadata.fills
    assert (fills.slot_page.tolist(), fills.arena_page.tolist()) == ([slot_page], [arena_page])
    ids = (torch.tensor([arena_page], dtype=torch.int32), torch.tensor([slot_page], dtype=torch.int32))
    for layer in range(LAYERS):
        expect = [t[layer].clone() for t in (w.pool.k_codes, w.pool.k_scales, w.pool.v_codes, w.pool.v_scales)]
        for t in expect:
            t[slot_page] = 0
        demote_pages_kv(w.pool.k_bf16[layer], w.pool.v_bf16[layer], *ids, *expect, *CLIP)
        got = (w.pool.k_codes[layer], w.pool.k_scales[layer], w.pool.v_codes[layer], w.pool.v_scales[layer])
        assert all(torch.equal(x, y) for x, y in zip(got, expect)), layer
        # offsets 14 and 15 (the two decode steps' rows) carry codes now; the step before left them
        assert not k_kept[layer][14:].any() and w.pool.k_codes[layer][slot_page, 14:].any(), layer
    spans, out, seg = w.forward(ForwardMode.EXTEND, [b], [5], shares={b: (a, 3)})
    _check(w, [b], spans, out, seg, [[]], decode=False, via_bf16_sets=[[(32, 48)]])


def test_decode_without_host_lengths_writes_int2_every_step(seed):
    # a ForwardBatch without seq_lens_cpu: "side" cannot know which pages complete without a sync,
    # so it writes both copies per token, and the step's INT2 slot holds codes at once
    w = World("head")
    a = 1
    w.forward(ForwardMode.EXTEND, [a], [40])
    spans, out, seg = w.forward(ForwardMode.DECODE, [a], [1], host_lens=False)
    _check(w, [a], spans, out, seg, [[(0, 41)]], decode=True)
    assert w.backend.forward_metadata.fills is None
    loc = int(w.req_pool.req_to_token[a, 40])
    assert all(w.pool.k_codes[layer][loc // P, loc % P].any() for layer in range(LAYERS))


def test_unknown_decode_write_form_is_refused_before_any_write(seed):
    w = World("head")
    w.forward(ForwardMode.EXTEND, [1], [40])
    codes = [c.clone() for c in w.pool.k_codes]
    w.backend.decode_write = "fused"
    with pytest.raises(ValueError, match="decode_write must be"):
        w.forward(ForwardMode.DECODE, [1], [1])
    assert all(torch.equal(a, b) for a, b in zip(codes, w.pool.k_codes))


@pytest.mark.parametrize("form", ["auto", "launch"])
def test_decode_without_a_recent_window_reads_the_new_token_from_int2(seed, form):
    # recent_tokens 0: at 48 tokens the tail page (32..47, the step's token last) is INT2 history and
    # the BF16 tier's last token is sink token 15, which the in-launch and side forms would take for
    # the new token's slot; the backend writes first instead ("separate")
    w = World("head", recent_pages=0)
    w.backend.decode_write = form
    a = 1
    w.forward(ForwardMode.EXTEND, [a], [47])
    arena = slice(0, w.pool.arena.scratch_page)  # the token's BF16 copy goes to the scratch page
    before = [t[arena].clone() for t in (*w.pool.k_bf16, *w.pool.v_bf16)]
    spans, out, seg = w.forward(ForwardMode.DECODE, [a], [1])
    _check(w, [a], spans, out, seg, [[(0, 16)]], decode=True)
    assert all(torch.equal(x, t[arena]) for x, t in zip(before, (*w.pool.k_bf16, *w.pool.v_bf16)))
