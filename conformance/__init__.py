"""Protocol conformance harnesses run against the gateway with real client libraries."""
