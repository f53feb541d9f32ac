"""int2_write_kv's bf16_copy on the hardware: the BF16 rows it stores beside the INT2 codes are the
bytes bf16_write_kv stores (the sglang pool's dual write in one launch), and the INT2 pages are
those of the write without it.  Real rotations (not exact in fp32), so any change in the rotation's
summation order between the two kernels shows as differing bf16 bits.  Skipped without CUDA."""

import pytest
import torch

from oscar_ray.kernels import bf16_write_kv, int2_write_kv

pytestmark = pytest.mark.gpu

HKV, D, PAGE = 8, 128, 16


@pytest.mark.parametrize("n", [1, 8, 32, 200])  # 200 > TWO_PASS_MAX_ROWS: the one-launch form
@pytest.mark.parametrize("per_head, absorbed", [(True, True), (False, False)])
def test_bf16_copy_equals_bf16_write_kv_cuda(seed, n, per_head, absorbed):
    torch.manual_seed(seed)
    shape = (HKV, D, D) if per_head else (D, D)
    rk = torch.linalg.qr(torch.randn(*shape, device="cuda", dtype=torch.float64))[0].float()
    rv = None if absorbed else torch.linalg.qr(torch.randn(*shape, device="cuda", dtype=torch.float64))[0].float()
    k = (torch.randn(n, HKV, D, device="cuda") * 3).to(torch.bfloat16)
    v = torch.randn(n, HKV, D, device="cuda").to(torch.bfloat16)
    pages = 2 + (n + PAGE - 1) // PAGE
    slot = torch.randperm(pages * PAGE, device="cuda")[:n].int()
    b_slot = torch.randperm(pages * PAGE, device="cuda")[:n].int()

    def int2_pages():
        return [torch.zeros(pages, PAGE, HKV, D // 4, dtype=torch.uint8, device="cuda"),
                torch.zeros(pages, PAGE, HKV, 2, dtype=torch.float16, device="cuda")]

    fused = int2_pages() + int2_pages()
    kb, vb = (torch.zeros(pages, PAGE, HKV, D, dtype=torch.bfloat16, device="cuda") for _ in "kv")
    int2_write_kv(k, v, rk, rv, 0.96, 0.0, slot // PAGE, slot % PAGE, *fused,
                  bf16_copy=(b_slot // PAGE, b_slot % PAGE, kb, vb))
    alone = int2_pages() + int2_pages()
    int2_write_kv(k, v, rk, rv, 0.96, 0.0, slot // PAGE, slot % PAGE, *alone)
    wkb, wvb = torch.zeros_like(kb), torch.zeros_like(vb)
    bf16_write_kv(k, v, rk, rv, b_slot // PAGE, b_slot % PAGE, wkb, wvb)
    torch.cuda.synchronize()
    for a, b in zip(fused + [kb, vb], alone + [wkb, wvb]):
        assert torch.equal(a, b), f"{int((a != b).sum())} of {a.numel()} differ"
    assert kb.abs().sum() > 0 and vb.abs().sum() > 0
