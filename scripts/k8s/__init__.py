"""The project's local Kubernetes test cluster: etcd + kube-apiserver v1.20.2 on loopback and a node agent
that really runs pods as local processes (see ``docs/kubernetes.md``, section "Local live cluster").

Modules: :mod:`.certs` (throwaway PKI), :mod:`.cluster` (``LocalCluster`` and its CLI),
:mod:`.node_agent` (the executing node agent), :mod:`.scheduling` (which pods fit the node),
:mod:`.pod_process` (a container as a process group, its log), :mod:`.log_server` (the kubelet log
endpoint the API server proxies ``pods/log`` to).
"""
