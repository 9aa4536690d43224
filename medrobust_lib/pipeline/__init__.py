"""Plain-Python steps that the Dagster assets (and notebooks) call: one function per asset."""
