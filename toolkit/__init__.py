"""Slurm-native toolkit for training ML models at scale."""

__version__ = "0.1.0"
