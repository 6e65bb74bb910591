"""Discovery: where engines come from (a static list, Kubernetes pods, Kubernetes Services)."""
