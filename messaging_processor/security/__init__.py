"""Identities and the one ACL model of every protocol (docs/security.md): users with argon2id
passwords and optional RocketMQ AccessKey/SecretKey pairs, API tokens, and rules over MQTT-style
topic paths and group names, kept in the store's key-value data and mirrored in memory."""

from .acl import Grant, Principal
from .directory import Directory
from .records import ACTIONS, ROLES, Rule, Token, User, check_rule
from .service import AuthFailure, Security
from .signatures import grpc_signature, remoting_content, remoting_signature

__all__ = [
    "ACTIONS",
    "ROLES",
    "AuthFailure",
    "Directory",
    "Grant",
    "Principal",
    "Rule",
    "Security",
    "Token",
    "User",
    "check_rule",
    "grpc_signature",
    "remoting_content",
    "remoting_signature",
]
