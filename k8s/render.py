"""Write each RayService's `spec.serveConfigV2` from its Serve config file, so configs/ is the one
source of truth. The manifest's other lines (and comments) are kept; only the block after
`  serveConfigV2: |` is replaced by the config file's text, indented by four spaces.

    python k8s/render.py            # rewrite the manifests
    python k8s/render.py --check    # exit 1 (and say which) when a manifest is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# manifest -> the Serve deploy file it embeds
MANIFESTS = {
    "k8s/rayservice-glm47.yaml": "configs/glm47.yaml",
    "k8s/rayservice-qwen3-8b.yaml": "configs/qwen3-8b.yaml",
}
KEY = "  serveConfigV2: |"
INDENT = "    "


def render(manifest_text: str, config_text: str) -> str:
    """`manifest_text` with its serveConfigV2 block replaced by `config_text`."""
    lines = manifest_text.splitlines()
    try:
        start = lines.index(KEY)
    except ValueError:
        raise ValueError(f"manifest has no line {KEY!r} (spec.serveConfigV2 as a literal block)") from None
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(INDENT)):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():  # blank lines after the block stay outside it
        end -= 1
    block = [INDENT + ln if ln.strip() else "" for ln in config_text.rstrip("\n").splitlines()]
    return "\n".join(lines[:start + 1] + block + lines[end:]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a manifest differs")
    args = ap.parse_args(argv)
    stale = []
    for manifest, config in MANIFESTS.items():
        path = REPO / manifest
        old = path.read_text()
        new = render(old, (REPO / config).read_text())
        if new != old:
            stale.append(manifest)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"stale serveConfigV2 in {', '.join(stale)}: run python k8s/render.py", file=sys.stderr)
        return 1
    for m in stale:
        print(f"rendered {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
