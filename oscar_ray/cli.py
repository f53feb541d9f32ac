"""`oscar-ray` command line: `quality` and `calibrate` (more subcommands arrive with their issues)."""

from __future__ import annotations

import argparse
import sys


def _quality(args: argparse.Namespace) -> int:
    from .calib_jobs.quality import run_quality
    from .calib_jobs.report import write_report
    from .config import QualityConfig

    cfg = QualityConfig.from_file(args.config) if args.config else QualityConfig()
    overrides = {k: v for k, v in {"seq_len": args.seq_len, "calib_seqs": args.calib_seqs,
                                   "eval_seqs": args.eval_seqs, "output_dir": args.output_dir}.items()
                 if v is not None}
    if overrides:
        cfg = QualityConfig.model_validate({**cfg.model_dump(), **overrides})
    res = run_quality(cfg, log=lambda msg: print(f"[quality] {msg}", flush=True))
    md, png = write_report(res)
    text = md.read_text()
    print(text[: text.index("## Per layer")] if "## Per layer" in text else text)
    print(f"wrote {md} and {png}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from .calib_jobs.calibrate import main as calibrate_main

    return calibrate_main(["--config", args.config] + (["--dry-run"] if args.dry_run else []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oscar-ray", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality", help="fit OSCAR on real activations and compare INT2 quantisers")
    q.add_argument("--config", help="YAML file for QualityConfig (default: built-in SmolLM2 settings)")
    q.add_argument("--seq-len", type=int)
    q.add_argument("--calib-seqs", type=int)
    q.add_argument("--eval-seqs", type=int)
    q.add_argument("--output-dir")
    q.set_defaults(func=_quality)
    c = sub.add_parser("calibrate", help="distributed OSCAR calibration on Ray (starts a local Ray if none runs)")
    c.add_argument("--config", required=True, help="CalibrationConfig YAML, e.g. configs/calib/smollm2.yaml")
    c.add_argument("--dry-run", action="store_true", help="print the placement plan only")
    c.set_defaults(func=_calibrate)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # user input: one clear line, no traceback
        print(f"oscar-ray {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
