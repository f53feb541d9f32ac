"""oscar-ray config → sglang 0.5.23 server arguments and the plugin's environment.

The Serve deployment starts sglang either as `python -m sglang.launch_server <argv>` or as
`sglang.Engine(**kwargs)` / `sglang.srt.ray.engine.RayEngine(**kwargs)`; both take the names of
sglang's ServerArgs (`sglang/srt/arg_groups/fields/*.py`: model_path, tp_size, nnodes, node_rank,
dist_init_addr, page_size, attention_backend, kv_cache_dtype, max_running_requests, ...).
OSCAR is selected with `attention_backend="oscar"` (registered by our plugin) and configured with
OSCAR_* variables; `kv_cache_dtype` stays "auto" (bf16): sglang 0.5.23 fixes the choices of
`--kv-cache-dtype` in `arg_groups/fields/model.py` and converts them in
`mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype`, which raises for any other string.

Example:
    cfg = SGLangEngineConfig(model_path="/models/Qwen3-8B", tp_size=2, rotations="/art/qwen3")
    argv, env = sglang_server_args(cfg), sglang_env(cfg)
    subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *argv], env={**os.environ, **env})
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from oscar_ray.config import OscarCacheConfig, StrictModel

from .settings import OscarSettings

OSCAR_BACKEND = "oscar"
Scalar = str | int | float | bool | None


class SGLangEngineConfig(StrictModel):
    """One sglang engine (one replica): model, parallelism, KV cache mode. `EngineSpec.config` of
    kind "sglang" validates into this."""

    model_path: str = Field(..., min_length=1, description="HF model directory (or hub id where sglang may fetch).")
    tp_size: int = Field(1, ge=1, description="Tensor-parallel degree (KV heads are split across the ranks).")
    nnodes: int = Field(1, ge=1, description="Nodes one engine spans (multi-node TP).")
    node_rank: int = Field(0, ge=0, description="This node's rank among nnodes.")
    dist_init_addr: str | None = Field(None, description="host:port of rank 0's torch.distributed store (nnodes>1).")
    kv_cache: Literal["oscar", "bf16"] = Field("oscar", description="oscar: INT2 + BF16 windows; bf16: stock sglang.")
    rotations: str | None = Field(None, description="RotationSet directory, or 'identity' (plain INT2); oscar only.")
    cache: OscarCacheConfig = Field(default_factory=OscarCacheConfig, description="Sink/recent windows, scales, page.")
    absorb_v: bool = Field(True, description="Fold R_V into W_v/W_o at weight load instead of rotating at runtime.")
    max_running_requests: int = Field(64, ge=1, description="Concurrent requests; sizes OSCAR's BF16 arena.")
    launcher: Literal["auto", "process", "ray"] = Field(
        "auto", description="process: sglang.Engine (schedulers as local processes, the GPUs this process sees); "
        "ray: sglang.srt.ray.engine.RayEngine (schedulers as Ray actors on the replica's placement group); "
        "auto: ray inside a placement group (placement.tp_size*pp_size > 1), else process.")
    max_queue: int | None = Field(None, ge=0, description="Requests waiting beyond max_running_requests before the "
                                  "engine answers EngineOverloaded (HTTP 429); None: no limit of ours.")
    mem_fraction_static: float | None = Field(None, gt=0, lt=1, description="Weights + KV share of GPU memory.")
    context_length: int | None = Field(None, ge=16, description="Override the model's context length.")
    host: str = Field("127.0.0.1", description="HTTP host of launch_server.")
    port: int = Field(30000, ge=1, le=65535, description="HTTP port of launch_server.")
    extra_args: dict[str, Scalar] = Field(default_factory=dict, description="Further ServerArgs fields, as given.")

    @model_validator(mode="after")
    def _check(self):
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank ({self.node_rank}) must be < nnodes ({self.nnodes})")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("dist_init_addr (rank 0's host:port) is required when nnodes > 1")
        if self.tp_size % self.nnodes:
            raise ValueError(f"tp_size ({self.tp_size}) must be a multiple of nnodes ({self.nnodes})")
        if self.kv_cache == "oscar" and not self.rotations:
            raise ValueError("rotations is required for kv_cache='oscar' (a RotationSet directory or 'identity')")
        ours = set(_core_kwargs(self))
        clash = sorted(ours & set(self.extra_args))
        if clash:
            raise ValueError(f"extra_args must not repeat the typed fields: {clash}")
        return self

    def settings(self) -> OscarSettings:
        """The plugin settings this config implies (kv_cache='oscar' only)."""
        if self.kv_cache != "oscar":
            raise ValueError("settings() is only defined for kv_cache='oscar'")
        c = self.cache
        return OscarSettings(rotations=self.rotations or "", sink_tokens=c.sink_tokens, recent_tokens=c.recent_tokens,
                             scale_dtype=c.scale_dtype, group_size=c.group_size, k_clip=None, v_clip=None,
                             absorb_v=self.absorb_v, key_bits=c.key_bits, page_layout=c.page_layout)


def _core_kwargs(cfg: SGLangEngineConfig) -> dict[str, Scalar]:
    kw: dict[str, Scalar] = {"model_path": cfg.model_path, "tp_size": cfg.tp_size,
                             "max_running_requests": cfg.max_running_requests, "host": cfg.host, "port": cfg.port}
    if cfg.nnodes > 1:
        kw.update(nnodes=cfg.nnodes, node_rank=cfg.node_rank, dist_init_addr=cfg.dist_init_addr)
    if cfg.mem_fraction_static is not None:
        kw["mem_fraction_static"] = cfg.mem_fraction_static
    if cfg.context_length is not None:
        kw["context_length"] = cfg.context_length
    if cfg.kv_cache == "oscar":
        # One backend for prefill and decode (both phases read the mixed cache); page_size = the
        # OSCAR page so sink/recent windows are whole sglang pages; the backend has no CUDA-graph
        # metadata path yet, so graphs are off (0.5.23 deprecates --disable-cuda-graph for these).
        kw.update(attention_backend=OSCAR_BACKEND, page_size=cfg.cache.page_size, kv_cache_dtype="auto",
                  cuda_graph_backend_decode="disabled", cuda_graph_backend_prefill="disabled")
    return kw


def sglang_engine_kwargs(cfg: SGLangEngineConfig) -> dict[str, Scalar]:
    """ServerArgs keyword arguments for `sglang.Engine(**kw)` / `RayEngine(**kw)` (host/port dropped:
    an in-process engine serves no HTTP)."""
    kw = {**_core_kwargs(cfg), **cfg.extra_args}
    kw.pop("host"), kw.pop("port")
    return kw


def sglang_server_args(cfg: SGLangEngineConfig) -> list[str]:
    """argv for `python -m sglang.launch_server`: `--name value` per field, a bare `--flag` for True,
    nothing for False/None (every boolean ServerArgs field is a store_true flag)."""
    argv: list[str] = []
    for name, value in {**_core_kwargs(cfg), **cfg.extra_args}.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def sglang_env(cfg: SGLangEngineConfig) -> dict[str, str]:
    """OSCAR_* variables every sglang process of this engine must see ({} for kv_cache='bf16')."""
    return cfg.settings().to_env() if cfg.kv_cache == "oscar" else {}
