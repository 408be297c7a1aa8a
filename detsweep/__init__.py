"""detsweep: hyperparameter sweeps for TensorFlow object detectors on Ray, tracked in MLflow."""

import os as _os
from importlib.metadata import version as _version

# TensorFlow's C++ start-up chatter (CUDA probing, CPU-feature notes) drowns our output;
# users can still ask for it by setting the variable themselves.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = _version("detsweep")
