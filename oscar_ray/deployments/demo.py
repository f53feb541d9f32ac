"""Start the CPU default app, ask it one chat question with the official openai client, print the
answer and shut everything down.

    python -m oscar_ray.deployments.demo
    python -m oscar_ray.deployments.demo --prompt "Name three rivers." --config configs/smollm2-cpu.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2-cpu.yaml"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="Serve YAML of configs/ (default: %(default)s)")
    ap.add_argument("--prompt", default="What is the capital of France? Answer in one sentence.")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-cpus", type=int, default=2, help="Ray logical CPUs (default: %(default)s)")
    args = ap.parse_args(argv)

    import yaml

    raw = yaml.safe_load(Path(args.config).read_text())
    http = raw.get("http_options") or {}
    host, port = http.get("host", "127.0.0.1"), int(http.get("port", 8000))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from openai import OpenAI
    from ray import serve

    from .builder import load_app_config, build_app

    cfg = load_app_config(args.config)
    # "local": the demo owns its cluster; a stray `ray start` on this machine (whose address Ray would
    # otherwise pick up from /tmp/ray/ray_current_cluster) must not make num_cpus an error.
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        serve.start(http_options={"host": host, "port": port})
        serve.run(build_app(cfg), name="oscar", route_prefix="/")
        print(f"[demo] {cfg.model_id} ({cfg.engine.kind} engine) up in {time.perf_counter() - t0:.1f} s at "
              f"http://{host}:{port}/v1", file=sys.stderr)
        client = OpenAI(base_url=f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/v1", api_key="none")
        t1 = time.perf_counter()
        reply = client.chat.completions.create(
            model=cfg.model_id, messages=[{"role": "user", "content": args.prompt}], max_tokens=args.max_tokens,
            temperature=0)
        print(f"[demo] Q: {args.prompt}", file=sys.stderr)
        print(reply.choices[0].message.content)
        u = reply.usage
        print(f"[demo] {u.prompt_tokens} prompt + {u.completion_tokens} completion tokens in "
              f"{time.perf_counter() - t1:.2f} s", file=sys.stderr)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
