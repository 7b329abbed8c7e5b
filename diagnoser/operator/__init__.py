"""The reference Kubernetes operator: claims recovery actions and carries them out."""
