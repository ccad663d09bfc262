"""Protocol-neutral message processing shared by all adapters (routing, acks, retries)."""
