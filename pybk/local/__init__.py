"""The local platform: etcd, bookies and autorecovery as child processes."""
