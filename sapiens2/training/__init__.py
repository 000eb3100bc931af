"""Fine-tuning of every Sapiens2 task: datasets, augmentations, targets, the official recipes, checkpoints
and the `sapiens2 train` command on HF Accelerate. `sapiens2.training.trainer.train` runs a training."""
