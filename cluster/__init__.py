"""CLUSTER mode (docs/cluster.md): everything that differs from LOCAL mode lives here, below the
processor's `StoreClient` port.

- store_node.py: a store node (`gateway store`), an embedded store served over the store wire;
- store_wire.py: the store wire, both sides (request codes, arguments, replies, errors);
- remote_store.py: `ClusterStoreClient`, the proxy's StoreClient over every live node, composed of
  nodes.py (connections, send batching), membership.py (live nodes, ordinals), ids.py (global
  handles, offsets, queue ids), sends.py (placement) and pops.py (pop fan-out, long polls);
- proxy.py: a proxy's links to the cluster (its StoreClient, its name server registration).
"""
