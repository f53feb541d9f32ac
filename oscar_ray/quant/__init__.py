"""OSCAR math core: torch (+ safetensors) only, CPU and GPU, float64 where it matters."""

from .artifact import ModelGeometry, RotationSet
from .attention import reference_attention
from .baselines import kivi2, naive_int2, oscar_int2, per_channel_int2, quarot_int2
from .centre import ChannelMean, add_value_mean, centred
from .clip import clip_index, clip_rows
from .clipfit import ClipFit
from .feedback import feedback_factor, quantize_int2_feedback
from .hadamard import bit_reversal_permutation, bit_reverse_indices, hadamard, permutation_matrix
from .int2 import KEY_BITS, dequantize_int2, fake_quantize, pack_codes, pack_int2, quantize_int2, unpack_codes, unpack_int2
from .metrics import attention_output_error, bits_per_element, int2_region_bits, logit_error
from .rotation import COMPOSITIONS, eigh_sorted, fit_rotation, orthogonality_error
from .stats import QueryMoment, ValueTargetDiag, ValueTargetSoftmax

__all__ = [
    "COMPOSITIONS", "KEY_BITS", "ChannelMean", "ClipFit", "ModelGeometry", "QueryMoment", "RotationSet", "ValueTargetDiag",
    "ValueTargetSoftmax", "add_value_mean", "attention_output_error", "bit_reversal_permutation", "bit_reverse_indices",
    "bits_per_element", "centred", "clip_index", "clip_rows", "dequantize_int2", "eigh_sorted", "fake_quantize",
    "feedback_factor",
    "fit_rotation", "hadamard", "int2_region_bits", "kivi2", "logit_error", "naive_int2", "oscar_int2",
    "orthogonality_error", "pack_codes", "pack_int2", "per_channel_int2", "permutation_matrix", "quantize_int2",
    "quantize_int2_feedback", "quarot_int2", "reference_attention", "unpack_codes", "unpack_int2",
]
