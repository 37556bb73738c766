"""The local platform: etcd, bookies and autorecovery as child processes.

- `platform`: `LocalCluster`, a manifest realised as processes: observe, act, reconcile through
  the controller and etcd side shared with the operator (`pybk.cluster`).
- `supervisor`: `pybk local up` in the foreground: signals, dead children, applying manifests.
- `control`: the cluster from another process: is one running, `down`, `detached`.
- `slots`, `datadir`, `manifest`, `errors`: stable ids and ports, the data dir's files, the
  manifest's local reading, what goes wrong.
- `process`, `etcd`, `bookie`: one child process each.
"""
