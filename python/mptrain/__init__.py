"""mptrain: a Python client of the mptrain coordinator (see client.py)."""
from .client import Client, JobFailed, spec_from_dict, to_dict
from .config import ConfigError

__all__ = ["Client", "ConfigError", "JobFailed", "spec_from_dict", "to_dict"]
__version__ = "0.1.0"
