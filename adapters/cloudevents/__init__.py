"""CloudEvents over HTTP (binding 1.0.2) on the gateway's HTTP port: ingest in binary, structured
and batched modes (ingest.py), pull consumption (pull.py) and Knative-style push subscriptions to
webhooks (subscriptions.py, push.py), over a sans-IO codec (codec.py, validate.py), the event <->
store mapping (mapping.py), Knative filters (filters.py) and CESQL (cesql.py). See docs/cloudevents.md."""

from .event import Event
from .service import CloudEvents, ServedAdapter

__all__ = ["CloudEvents", "Event", "ServedAdapter"]
