"""Predefined failure rules: schema, loader, prefilter, multi-line assembly and the scanner.

Pure: no web framework, database or cache client (import-linter enforces it).
"""

from diagnoser.rules.engine import JobScanner
from diagnoser.rules.events import RuleEvent
from diagnoser.rules.loader import load_dir
from diagnoser.rules.problems import Problem, RuleLoadError
from diagnoser.rules.registry import RuleRegistry, check, make_batch, run_examples, scan_lines
from diagnoser.rules.relations import Relations, relate
from diagnoser.rules.ruleset import RuleSet
from diagnoser.rules.schema import Action, Category, Scope, Severity, Unit

__all__ = [
    "Action",
    "Category",
    "JobScanner",
    "Problem",
    "Relations",
    "RuleEvent",
    "RuleLoadError",
    "RuleRegistry",
    "RuleSet",
    "Scope",
    "Severity",
    "Unit",
    "check",
    "load_dir",
    "make_batch",
    "relate",
    "run_examples",
    "scan_lines",
]
