"""The controller of replica groups (docs/cluster.md, "Controller (etcd)"): the strongly consistent
record of each group's primary, epoch and SyncStateSet.

- base.py: `GroupState`, the `Controller` protocol and its errors;
- etcd.py: `EtcdController`, the controller kept in etcd;
- etcd_api.py: the small client of etcd's v3 JSON API it uses.
"""

from cluster.controller.base import (
    Controller,
    ControllerError,
    ControllerUnavailable,
    GroupState,
    NotEligible,
    NotPrimary,
    PrimaryExists,
)
from cluster.controller.etcd import EtcdController

__all__ = [
    "Controller",
    "ControllerError",
    "ControllerUnavailable",
    "EtcdController",
    "GroupState",
    "NotEligible",
    "NotPrimary",
    "PrimaryExists",
]
