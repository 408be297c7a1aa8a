"""Config files in, typed objects out: the only place that reads user configuration."""

from .loader import load_trial_config, parse_override, read_trial_tree, read_yaml_mapping, validate
from .schema import (
    AugmentationConfig,
    DataConfig,
    DatasetConfig,
    FineTuneConfig,
    LearningRateConfig,
    ModelConfig,
    OptimizerConfig,
    ScalingConfig,
    TrackingConfig,
    TrainConfig,
    TrialConfig,
)

__all__ = [
    "AugmentationConfig",
    "DataConfig",
    "DatasetConfig",
    "FineTuneConfig",
    "LearningRateConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ScalingConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrialConfig",
    "load_trial_config",
    "parse_override",
    "read_trial_tree",
    "read_yaml_mapping",
    "validate",
]
