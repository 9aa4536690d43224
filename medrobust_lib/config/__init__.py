"""Typed suite configuration: ``Suite`` and one module per section."""

from medrobust_lib.config.suite import DemoConfig, PerturbationConfig, Suite, load_suite

__all__ = ["DemoConfig", "PerturbationConfig", "Suite", "load_suite"]
