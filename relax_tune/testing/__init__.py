"""Fixtures for the tests, the benchmarks and the corpus, not part of the tuner's API: small
models built in code (``models``; shipped so that ``relax-tune tune
relax_tune.testing.models:NAME`` works on a fresh install), kernels (``workloads``) and a local
RPC tracker with servers (``rpc_cluster``)."""
