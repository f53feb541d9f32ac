"""Per-architecture facts the OSCAR cache depends on: where q/k-norm and RoPE sit, and whether V can
absorb its rotation.

The kernels store keys post-norm, post-RoPE (what transformers hands its attention function), so the
key rotation R_K is always applied there, at runtime (q·R_K, k·R_K; exact because R_K is orthogonal
and applied after RoPE). Values reach attention straight from v_proj in all three families (no V-norm,
no V-RoPE), which is what lets W_v absorb R_V and W_o absorb R_Vᵀ at load time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchFacts:
    """What a model family does between the projections and the attention kernel."""

    family: str
    qk_norm: str  # "none" | "per_head_rms" (RMSNorm over head_dim of q and k, *before* RoPE)
    rotary: str  # "full" | "partial" (only the first partial_rotary_factor·d dims are rotated)
    v_absorbable: bool  # nothing nonlinear between v_proj and attention
    attention_module: str  # transformers class whose q/k/v/o_proj hold the weights

    def describe(self) -> str:
        return (f"{self.family}: qk_norm={self.qk_norm}, rope={self.rotary}, "
                f"V absorbable={self.v_absorbable}")


ARCHITECTURES: dict[str, ArchFacts] = {
    # SmolLM2 is a Llama: q/k/v/o_proj, full RoPE on q and k, no norms inside attention.
    "llama": ArchFacts("llama", "none", "full", True, "LlamaAttention"),
    # Qwen3: q_norm/k_norm (RMSNorm per head) applied to q_proj/k_proj outputs, then RoPE.
    "qwen3": ArchFacts("qwen3", "per_head_rms", "full", True, "Qwen3Attention"),
    # GLM-4 MoE (GLM-4.5/4.7): optional per-head qk-norm (use_qk_norm), RoPE on the first half of
    # head_dim (partial_rotary_factor 0.5); V untouched.
    "glm4_moe": ArchFacts("glm4_moe", "per_head_rms", "partial", True, "Glm4MoeAttention"),
}


def arch_facts(config) -> ArchFacts:
    """Facts for a transformers config (by `model_type`); ValueError for a family we have not checked."""
    model_type = getattr(config, "model_type", None)
    facts = ARCHITECTURES.get(model_type)
    if facts is None:
        raise ValueError(f"model_type {model_type!r} is not one of {sorted(ARCHITECTURES)}: its attention "
                         "layout (q/k-norm, RoPE, V path) has not been checked for OSCAR")
    if model_type == "glm4_moe" and not getattr(config, "use_qk_norm", False):
        facts = ArchFacts(facts.family, "none", facts.rotary, facts.v_absorbable, facts.attention_module)
    return facts
