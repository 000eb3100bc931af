"""Sapiens2 human-centric vision models in plain PyTorch."""

# First, before anything imports torch: PyTorch reads its MPS fallback setting when it is imported.
import sapiens2._mps_fallback  # noqa: F401
from sapiens2.errors import CheckpointError, CheckpointNotFoundError, ConfigError, Sapiens2Error
from sapiens2.models.config import Sapiens2Config, load_config
from sapiens2.models.hub import (
    ResolvedCheckpoint,
    checkpoint_download_size,
    from_pretrained,
    resolve_checkpoint,
)
from sapiens2.models.modeling import (
    Sapiens2Backbone,
    Sapiens2ForImageMatting,
    Sapiens2ForNormalEstimation,
    Sapiens2ForPointmapEstimation,
    Sapiens2ForPoseEstimation,
    Sapiens2ForSemanticSegmentation,
    Sapiens2Model,
    build_model,
)
from sapiens2.runtime.runtime import Runtime

__all__ = [
    "CheckpointError",
    "CheckpointNotFoundError",
    "ConfigError",
    "ResolvedCheckpoint",
    "Runtime",
    "Sapiens2Backbone",
    "Sapiens2Config",
    "Sapiens2Error",
    "Sapiens2ForImageMatting",
    "Sapiens2ForNormalEstimation",
    "Sapiens2ForPointmapEstimation",
    "Sapiens2ForPoseEstimation",
    "Sapiens2ForSemanticSegmentation",
    "Sapiens2Model",
    "build_model",
    "checkpoint_download_size",
    "from_pretrained",
    "load_config",
    "resolve_checkpoint",
]
