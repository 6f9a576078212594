"""Differential tests: the same scripts on Hugging Face Accelerate and on ``trainer.Accelerator``."""
