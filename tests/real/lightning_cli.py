#!/usr/bin/env python3
"""A real LightningCLI program (CPU, a tiny language model on random tokens, no downloads)
that dies of a real torch.OutOfMemoryError while data.batch_size x data.seq_len > model.budget.

    python tests/real/lightning_cli.py fit --config tests/real/lightning_cli.yaml \
        [--trainer.devices 2] [--data.seq_len 64] [--ckpt_path=...]

Everything else is Lightning's own: its CLI and config file (jsonargparse), its launcher
(`--trainer.devices 2` with the ddp strategy starts the second process itself), its
ModelCheckpoint and logger folders, its `.ckpt` files and its resume (`--ckpt_path`).

The OOM is raised from training_step once the trainer's global_step reaches
model.oom_at_step, so it surfaces through Lightning's loop like a real one, with the
message PyTorch's caching allocator writes (the one allocation that failed, the memory
in use). Each launch's rank 0 appends one line to model.report (if set): the settings it
ran with, the world size, the checkpoint it resumed from and the global_step it reached.
"""
import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import lightning as L
from lightning.pytorch.cli import LightningCLI


def oom_message(tokens):
    gib = 1024 ** 3
    tried = tokens * 8 * 1024 ** 2
    return (f"CUDA out of memory. Tried to allocate {tried / gib:.2f} GiB. GPU 0 has a total capacity of "
            "23.65 GiB of which 1.19 GiB is free. Including non-PyTorch memory, this process has 22.45 GiB "
            "memory in use. Of the allocated memory 21.10 GiB is allocated by PyTorch, and 912.00 MiB is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
            "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


class RandomTokens(Dataset):
    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]


class TokenData(L.LightningDataModule):
    def __init__(self, batch_size: int = 8, seq_len: int = 32, num_workers: int = 0,
                 samples: int = 256, vocab: int = 64):
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        h = self.hparams
        return DataLoader(RandomTokens(h.samples, h.seq_len, h.vocab), batch_size=h.batch_size,
                          num_workers=h.num_workers, shuffle=False)


class TinyLM(L.LightningModule):
    def __init__(self, vocab: int = 64, hidden: int = 32, budget: int = 256, oom_at_step: int = 3,
                 report: str = "", manual: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = not manual
        self.emb = nn.Embedding(vocab, hidden)
        self.head = nn.Linear(hidden, vocab)

    def training_step(self, batch, batch_idx):
        micro, seq = batch.shape
        if micro * seq > self.hparams.budget and self.global_step >= self.hparams.oom_at_step:
            raise torch.OutOfMemoryError(oom_message(micro * seq))
        logits = self.head(self.emb(batch[:, :-1]))
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_fit_start(self):
        self._report("start")

    def on_fit_end(self):
        self._report("end")

    def _report(self, when):
        if not self.hparams.report or not self.trainer.is_global_zero:
            return
        dm, t = self.trainer.datamodule, self.trainer
        micro, accum = dm.hparams.batch_size, t.accumulate_grad_batches
        with open(self.hparams.report, "a") as f:
            f.write(json.dumps({
                "when": when, "micro": micro, "accum": accum, "world": t.world_size,
                "seq": dm.hparams.seq_len, "global_batch": micro * accum * t.world_size,
                "ckpt_path": t.ckpt_path, "global_step": t.global_step,
            }) + "\n")


if __name__ == "__main__":
    LightningCLI(TinyLM, TokenData)
