"""The CPU ("llvm") design space and the rules only it uses: multi-level tiling with
register tiles, rfactor, the fused attention's row-block schedule, the layout rewrite of
weights and the in-kernel packing of reused GEMM operands."""

from .space import cpu_function_rules, cpu_postprocs, cpu_rules, cpu_space

__all__ = ["cpu_function_rules", "cpu_postprocs", "cpu_rules", "cpu_space"]
