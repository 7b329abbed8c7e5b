"""diagnoser: LLM-assisted log diagnosis for GPU clusters that train large language models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("diagnoser")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
