"""Fine-tuning of every Sapiens2 task: datasets, augmentations, targets, the official recipes, checkpoints
and the `sapiens2 train` command on HF Accelerate. `sapiens2.training.trainer.train` runs a training.

Imports `sapiens2.tasks` and everything below it; never the runtime, the batch engine or the server."""
