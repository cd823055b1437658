"""Local Messages-API-compatible server that stands in for Anthropic in tests, demo and bench.

Point the real SDK at it: ``anthropic.Anthropic(base_url=url, api_key="sandbox-key")`` with
``url`` from :func:`running_sandbox`, or ``ANTHROPIC_BASE_URL``.
"""

from pgqueue.sandbox.app import SandboxConfig, SandboxState, ScriptedFault, create_app
from pgqueue.sandbox.limits import RateLimiter, RateLimits
from pgqueue.sandbox.server import running_sandbox, serve

__all__ = [
    "RateLimiter",
    "RateLimits",
    "SandboxConfig",
    "SandboxState",
    "ScriptedFault",
    "create_app",
    "running_sandbox",
    "serve",
]
