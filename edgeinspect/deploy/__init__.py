"""On-prem deployment: one plant inventory rendered into compose files, role settings and Kubernetes manifests."""
