"""Lightning's DeviceStatsMonitor in a tiny training run on torchmem's CUDA allocator.

DeviceStatsMonitor logs ``torch.cuda.memory_stats()`` around every batch: with torchmem
installed, those are torchmem's numbers, so a Lightning user's dashboards keep working.
The model uses element-wise operations only (cuBLAS does not run on the simulated device).
"""

import warnings

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

import torchmem


class Scale(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4096))

    def training_step(self, batch, batch_index):
        with torchmem.tag("step"):
            return (self.weight * batch).sum()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(8, 4096), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Remember(Logger):
    """Keeps every logged metric."""

    def __init__(self):
        super().__init__()
        self.metrics: list[dict[str, float]] = []

    @property
    def name(self):
        return "remember"

    @property
    def version(self):
        return 0

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs):
        pass

    @rank_zero_only
    def log_metrics(self, metrics, step=None):
        self.metrics.append(dict(metrics))


def test_device_stats_monitor_logs_torchmems_statistics(tmp_path):
    logger = Remember()
    trainer = pl.Trainer(accelerator="cuda", devices=1, max_steps=3, logger=logger,
                         callbacks=[DeviceStatsMonitor()], log_every_n_steps=1,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about workers and precision
        trainer.fit(Scale())

    logged = [m for m in logger.metrics
              if any(k.endswith("/allocated_bytes.all.current") for k in m)]
    assert len(logged) >= 3
    last = logged[-1]
    [allocated_key] = [k for k in last if k.endswith("on_train_batch_end/allocated_bytes.all.current")]
    prefix = allocated_key[: -len("allocated_bytes.all.current")]
    assert last[prefix + "allocated_bytes.all.current"] > 0
    assert last[prefix + "reserved_bytes.all.current"] >= last[prefix + "allocated_bytes.all.current"]
    assert set(torchmem.memory_stats("cuda:0")) >= {k[len(prefix):] for k in last if k.startswith(prefix)}
    assert torchmem.tag_stats("cuda:0")["step"]["peak_bytes"] > 0  # tags work under Lightning
