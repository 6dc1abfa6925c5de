"""Benchmarks of the tuner against MetaSchedule, ONNX Runtime and PyTorch, never shipped in the
wheel: run each as a module from the repository root (``python -m benchmarks.bench_kernels``),
so that they import each other (``benchmarks.timing``) and ``relax_tune`` by package path."""
