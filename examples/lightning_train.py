"""An ordinary Lightning script (Trainer.fit, torchmetrics metrics), for `torchmem run`.

    python -m torchmem run examples/lightning_train.py          # clean: no leaks, no growth
    python -m torchmem run examples/lightning_train.py --leak   # keeps every step's logits

Nothing in it knows about torchmem: `run` finds the training steps from the optimizer's
`step()`, reports torchmetrics' import-time constant (chrf's `_EPS_SMOOTHING`) as such, and
with `--leak` names the line whose tensors pile up step after step.
"""

import sys

import lightning as L
import torch
import torchmetrics
from torch.utils.data import DataLoader, TensorDataset

KEEP_EVERY_STEP = "--leak" in sys.argv[1:]
KEPT = []  # with --leak: one tensor per step, never trimmed


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=4)
        self.chrf = torchmetrics.text.CHRFScore()  # imports torchmetrics.functional.text.chrf

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.accuracy(logits, y)
        self.log("train_acc", self.accuracy, on_step=True)
        if KEEP_EVERY_STEP:
            KEPT.append(logits.detach().clone())  # the leak: a history nobody trims
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(640, 32, generator=generator), torch.randint(0, 4, (640,), generator=generator))
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), DataLoader(data, batch_size=32))
    print("fit done")
