"""PySpark analytics over the message store (Python data source API)."""
