"""The reference Kubernetes operator: claims recovery actions from the service and carries them out."""
