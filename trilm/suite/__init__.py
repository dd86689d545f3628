"""Suites: many runs (families × sizes × token budgets) defined in one YAML, planned, launched, monitored and
analysed together. ``trilm suite plan|launch|status|analyse SUITE``; see ``docs/suites.md``."""

from trilm.suite.config import (
    FamilySpec,
    HardwareConfig,
    SizeSpec,
    Suite,
    SuiteConfig,
    SuiteDataConfig,
    SuiteRun,
    load_suite,
)

__all__ = [
    "FamilySpec",
    "HardwareConfig",
    "SizeSpec",
    "Suite",
    "SuiteConfig",
    "SuiteDataConfig",
    "SuiteRun",
    "load_suite",
]
