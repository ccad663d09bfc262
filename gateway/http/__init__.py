"""The gateway's HTTP port: health, Prometheus metrics, the admin REST API, the read API for Spark,
and CloudEvents (adapters/cloudevents, mounted as extra routers)."""

from .adapter import HttpAdapter
from .app import create_app
from .errors import STATUS_BY_KIND, problem

__all__ = ["STATUS_BY_KIND", "HttpAdapter", "create_app", "problem"]
