"""One calibration worker = one model replica, as a Ray actor; resumable from checkpoints.

A worker feeds its shard of chunks through the model with the capture hook, into a statistics object
the driver sends (PassOneStats, PassTwoStats or ClipFitStats from `fit.py`).  Every
`checkpoint_every` chunks it saves (chunks done, statistics) atomically; a replacement actor (Ray
restarts a dead one, `max_restarts`) resumes from there, so the sums, and the artifact, are the same
bits as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import torch

from .capture import run_sequences

# "<worker>:<chunks>:<marker path>": that worker's process exits once, after that many chunks of a
# pass, and leaves the marker so its replacement lives (fault-tolerance tests).
KILL_ENV = "OSCAR_CALIB_KILL_AFTER"


def _pass_key(pass_name: str, chunk_ids: list[int], chunks: list[torch.Tensor]) -> str:
    h = hashlib.sha256(pass_name.encode())
    for i, c in zip(chunk_ids, chunks):
        h.update(str(i).encode())
        h.update(c.numpy().tobytes())
    return h.hexdigest()


class CalibWorker:
    def __init__(self, worker_id: int, model: str, ckpt_dir: str, checkpoint_every: int, threads: int,
                 gpus: int = 0):
        from ..models.loader import load_model

        torch.set_num_threads(max(1, threads))
        self.worker_id = worker_id
        self.ckpt_dir = Path(ckpt_dir)
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_every = checkpoint_every
        self.model, _ = load_model(model, dtype=torch.bfloat16 if gpus else torch.float32)
        if gpus == 1:
            self.model.to("cuda")
        elif gpus > 1:  # one replica over several GPUs: layers split by accelerate, no weights duplicated
            from accelerate import dispatch_model, infer_auto_device_map

            self.model = dispatch_model(self.model, infer_auto_device_map(self.model))

    def _ckpt(self, pass_name: str) -> Path:
        return self.ckpt_dir / f"worker{self.worker_id}-{pass_name}.pt"

    def _maybe_die(self, done: int) -> None:
        spec = os.environ.get(KILL_ENV)
        if not spec:
            return
        worker, after, marker = spec.split(":", 2)
        worker, after, marker = int(worker), int(after), Path(marker)
        if worker == self.worker_id and done == after and not marker.exists():
            marker.write_text("1")
            os._exit(1)  # a real process death, as a preempted node or OOM kill would be

    def run_pass(self, pass_name: str, chunk_ids: list[int], chunks: list[torch.Tensor], stats):
        """Feed `chunks` into `stats` (resuming a checkpoint of the same pass and data); returns
        (stats, tokens, seconds)."""
        key = _pass_key(pass_name, chunk_ids, chunks)
        path = self._ckpt(pass_name)
        done = 0
        if path.is_file():
            saved = torch.load(path, weights_only=False)
            if saved["key"] == key:
                done, stats = saved["done"], saved["stats"]
        t0, tokens = time.time(), 0
        device = next(self.model.parameters()).device
        from tqdm import tqdm

        # A bar only on a terminal (local runs); Ray job logs get the driver's per-pass summary lines.
        for i in tqdm(range(done, len(chunks)), desc=f"worker {self.worker_id} {pass_name}", unit="chunk",
                      disable=not sys.stderr.isatty()):
            tokens += run_sequences(self.model, [chunks[i].to(device)], stats.sink)
            done = i + 1
            if done % self.checkpoint_every == 0 or done == len(chunks):
                tmp = path.with_suffix(".tmp")
                torch.save({"key": key, "done": done, "stats": stats}, tmp)
                os.replace(tmp, path)
            self._maybe_die(done)
        return stats, tokens, time.time() - t0
