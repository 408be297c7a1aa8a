"""Trained checkpoints as models to serve (a TensorFlow SavedModel, a TFLite file) and
detections on image files (``detsweep export``, ``detsweep predict``).

Nothing is imported here: the CLI loads :mod:`.commands` to build its parser, and
TensorFlow comes in only when a command runs.
"""
