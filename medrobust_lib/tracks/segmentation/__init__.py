"""Segmentation track: clean, perturbed and adversarial evaluation and its statistics."""
