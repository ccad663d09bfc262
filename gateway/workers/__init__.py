"""`gateway start --workers N`: the supervisor (store process) and the claims of unique sessions
across its worker processes (docs/workers.md)."""

from .claims import ClaimsBroker, ClaimsClient
from .supervisor import Supervisor, WorkerLink, supervise

__all__ = ["ClaimsBroker", "ClaimsClient", "Supervisor", "WorkerLink", "supervise"]
