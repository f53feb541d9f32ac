"""Model loading, per-architecture facts and weight transforms."""

from .loader import AttentionGeometry, attention_geometry, load_model, resolve_model_path

__all__ = ["AttentionGeometry", "attention_geometry", "load_model", "resolve_model_path"]
