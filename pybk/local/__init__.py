"""The local platform: etcd, bookies and autorecovery as child processes.

- `platform`: `LocalCluster`, a manifest realised as processes: observe, act, reconcile through
  the controller and etcd side shared with the operator (`pybk.cluster`).
- `supervisor`: `pybk local up` in the foreground: signals, dead children, applying manifests.
- `control`: the cluster from another process: is one running, `down`, `detached`.
- `slots`, `datadir`, `manifest`, `errors`: stable ids and ports, the data dir's files, the
  manifest's local reading, what goes wrong.
- `secure`: `up --secure`'s one-time setup (throwaway CA, identities, tokens, etcd users) and
  what each process is given; `client`: what a client of a local cluster needs (local.json).
- `process`, `etcd`, `bookie`: one child process each.
"""
