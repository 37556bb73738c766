"""The Kubernetes platform for the cluster controller (kopf handlers)."""
