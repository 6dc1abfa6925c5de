"""Full tiles without predicates: the predicated-tile rewrites of a replayed schedule.

A schedule replayed on symbolic extents (``relax_tune.dynamic.replay``) guards every tile
that may not divide ``n`` by a block predicate. ``unswitch_partial_tiles`` runs each full
tile without its predicates (one test per loop iteration instead of one per element), and
a partial vector tile in chunks of 16 lanes, then 4 (``VECTOR_CHUNKS``).
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

from .buckets import _dtype, _vars_in, symbolic_vars

UNSWITCH_DEPTH = 4
"""Full-tile tests nested in one loop nest at most (each adds a copy of the code below it
without the predicates it covers)."""


def unswitch_partial_tiles(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` (a schedule replayed on symbolic extents) with every full tile run without
    its predicates.

    A tile that does not divide ``n`` is guarded by a block predicate (``T.where(i < n)``)
    evaluated in the innermost loop: a symbolic division per element that also keeps LLVM
    from unrolling and vectorising the tile as it does in the static kernel the record was
    timed as (measured: docs/design/dynamic-shapes.md, "Full tiles run the static kernel's
    code"). Here a loop's body becomes ``if <every predicate holds for the whole body>:
    <body without them> else: <body as it was>``: the test is each predicate's upper bound
    over the loops inside (``tvm.sym.Analyzer.int_set``), evaluated once per iteration of
    the loop. Each predicate is tested at the outermost loop whose inner loops it depends
    on all have a constant extent (``_full_tile_guard``): a row-tiled matmul's row tiles at
    its parallel loop (only the last iteration is partial), a reduction over ``n`` split by
    16 inside its chunk loop (only the last chunk is partial). Up to ``UNSWITCH_DEPTH``
    tests nest.
    A predicate whose bound cannot be expressed stays where it is. The result shares
    definitions between the two copies; ``dispatch_function`` gives each its own."""
    root = func.body
    if not isinstance(root, SBlockRealize):
        return func
    allowed = {_identity(v) for v in symbolic_vars(func)}
    analyzer = tvm.sym.Analyzer()
    body = _unswitch_stmt(root.block.body, allowed, UNSWITCH_DEPTH, analyzer,
                          above=_above_intermediates(root.block))
    body = _chunk_partial_vectors(body, allowed, analyzer)
    if body.same_as(root.block.body):
        return func
    block = _rebuild_block(root.block, body=body)
    return func.with_body(SBlockRealize(root.iter_values, root.predicate, block))


VECTOR_CHUNKS = (16, 4)
"""Lanes per chunk of a partial vector tile, then per chunk of the chunk that straddles the
end (one AVX-512 float32 register, two AVX2 ones; then one SSE register)."""


def _chunk_partial_vectors(stmt, defined: set, analyzer) -> tirx.Stmt:
    """``stmt`` with each vectorised loop whose blocks are predicated on its own lanes run
    in chunks of ``VECTOR_CHUNKS`` lanes, every full chunk without the predicate.

    What unswitching leaves predicated is the partial tile: a 64-lane vector tile over
    ``n`` with lanes past ``n``. TVM cannot vectorise a predicated body and runs the
    whole tile as a scalar loop (the BERT layer's q k^T at n=300 on bucket 256's records,
    its last column tile 44 of 64 lanes; measured: docs/design/dynamic-shapes.md, "The
    partial tile, loop by loop"). In chunks, only the lanes of the one chunk that straddles
    ``n`` run scalar, and chunks wholly past ``n`` are skipped."""
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_chunk_partial_vectors(s, defined, analyzer) for s in stmt.seq]
        if all(a.same_as(b) for a, b in zip(parts, stmt.seq)):
            return stmt
        return tirx.SeqStmt(parts)
    if isinstance(stmt, tirx.IfThenElse):
        then = _chunk_partial_vectors(stmt.then_case, defined, analyzer)
        other = None if stmt.else_case is None else \
            _chunk_partial_vectors(stmt.else_case, defined, analyzer)
        if then.same_as(stmt.then_case) and (other is None or other.same_as(stmt.else_case)):
            return stmt
        return tirx.IfThenElse(stmt.condition, then, other)
    if not isinstance(stmt, tirx.For):
        return stmt
    if stmt.kind == tirx.ForKind.VECTORIZED:
        return _vector_chunks(stmt, defined, analyzer, VECTOR_CHUNKS)
    body = _chunk_partial_vectors(stmt.body, defined | {_identity(stmt.loop_var)}, analyzer)
    if body.same_as(stmt.body):
        return stmt
    return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                    stmt.thread_binding, stmt.annotations)


def _vector_chunks(loop: tirx.For, defined: set, analyzer, widths: Sequence[int]
                   ) -> tirx.Stmt:
    """A vectorised ``loop`` as ``for c: if <chunk c full>: <chunk without predicates>
    else: <chunk>``, each chunk ``widths[0]`` vectorised lanes, the partial chunk in
    turn in chunks of ``widths[1]``, and so on; ``loop`` itself when its extent is no
    multiple of the chunk or no predicate depends on its lanes."""
    if not widths:
        return loop
    width = widths[0]
    var = loop.loop_var
    extent = loop.extent
    if not isinstance(extent, tirx.IntImm) or int(extent.value) <= width or \
            int(extent.value) % width or not isinstance(loop.min, tirx.IntImm) or \
            int(loop.min.value) != 0:
        return _vector_chunks(loop, defined, analyzer, widths[1:])
    if not any(_identity(v) == _identity(var) for realize, _ in
               _predicated_blocks(loop.body, []) for v in _vars_in(realize.predicate)):
        return loop
    dtype = _dtype(var)
    chunk = tirx.Var(f"{var.name}_c", dtype)
    lane = tirx.Var(f"{var.name}_l", dtype)
    body = _substitute(loop.body, var, chunk * tirx.IntImm(dtype, width) + lane)
    inner = tirx.For(lane, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, width),
                     tirx.ForKind.VECTORIZED, body, loop.thread_binding, loop.annotations)
    inside = defined | {_identity(chunk)}
    terms, bounded, empty = _full_tile_guard(inner, inside, analyzer)
    if not terms:
        return loop
    body = _full_or_partial(terms, _strip_predicates(inner, bounded),
                            _vector_chunks(inner, inside, analyzer, widths[1:]), empty)
    return tirx.For(chunk, tirx.IntImm(dtype, 0),
                    tirx.IntImm(dtype, int(extent.value) // width), tirx.ForKind.SERIAL, body)


def _full_or_partial(terms: list, fast, slow, empty) -> tirx.Stmt:
    """``if <all terms>: fast else: slow``, ``slow`` skipped under ``empty`` (a tile wholly
    past n, the rest of a partial one, does nothing)."""
    if empty is not None:
        slow = tirx.IfThenElse(tirx.Not(empty), slow, None)
    guard = terms[0]
    for term in terms[1:]:
        guard = tirx.And(guard, term)
    return tirx.IfThenElse(guard, fast, slow)


def _substitute(stmt, var: tirx.Var, value) -> tirx.Stmt:
    """``stmt`` with ``value`` for ``var`` (TVM 0.27 exposes no substitution to Python;
    specialising a function of ``var`` is one)."""
    return tirx.PrimFunc([var], stmt).specialize({var: value}).body


def _identity(node) -> int:
    """A key for a TIR node that is equal exactly for the same node (``same_as``): the
    hash of a TVM object is its handle's."""
    return hash(node)


def _unswitch_stmt(stmt, defined: set, depth: int, analyzer, tested: tuple = (),
                   above: frozenset = frozenset()) -> tirx.Stmt:
    """``stmt`` with full-tile tests at up to ``depth`` nested loop levels of each nest;
    ``tested``: the tests already made around it (not repeated inside); ``above``: loops
    that get no test (``_above_intermediates``)."""
    if depth <= 0:
        return stmt
    if isinstance(stmt, tirx.SeqStmt):
        parts = [_unswitch_stmt(s, defined, depth, analyzer, tested, above) for s in stmt.seq]
        if all(a.same_as(b) for a, b in zip(parts, stmt.seq)):
            return stmt
        return tirx.SeqStmt(parts)
    if not isinstance(stmt, tirx.For) or stmt.kind == tirx.ForKind.VECTORIZED:
        return stmt
    inner_defined = defined | {_identity(stmt.loop_var)}
    terms, bounded, empty = ([], {}, None) if _identity(stmt) in above else \
        _full_tile_guard(stmt.body, inner_defined, analyzer, tested)
    if not terms:
        body = _unswitch_stmt(stmt.body, inner_defined, depth, analyzer, tested, above)
    else:
        tested = tested + tuple(terms)
        fast = _unswitch_stmt(_strip_predicates(stmt.body, bounded), inner_defined,
                              depth - 1, analyzer, tested, above)
        slow = _unswitch_stmt(stmt.body, inner_defined, depth - 1, analyzer, tested, above)
        body = _full_or_partial(terms, fast, slow, empty)
    if body.same_as(stmt.body):
        return stmt
    return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body,
                    stmt.thread_binding, stmt.annotations)


def _above_intermediates(root: SBlock) -> frozenset:
    """The loops (``_identity``) that enclose, strictly, the innermost loop holding every
    access of one of ``root``'s intermediate buffers.

    TVM allocates an intermediate at the innermost loop that holds all its accesses and
    compacts it to what one iteration there touches: a matmul computed at a column tile of
    the mask that follows it is a tile of 2 x 4 x 256 floats, in L1. A full-tile test at a
    loop above that one splits the accesses into two copies of the loop nest, so the
    intermediate moves up to the test's loop and grows to the whole symbolic region (the
    Llama block's q k^T + causal mask at n=256: 2 x 508 x 256 floats; measured:
    docs/design/dynamic-shapes.md, "Where a full-tile test may sit")."""
    intermediates = {_identity(b) for b in root.alloc_buffers}
    paths: dict[int, list] = {}

    def visit(stmt, loops: list) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, loops)
        elif isinstance(stmt, tirx.For):
            visit(stmt.body, loops + [_identity(stmt)])
        elif isinstance(stmt, tirx.IfThenElse):
            visit(stmt.then_case, loops)
            if stmt.else_case is not None:
                visit(stmt.else_case, loops)
        elif isinstance(stmt, SBlockRealize):
            block = stmt.block
            for region in list(block.reads) + list(block.writes):
                key = _identity(region.source)
                if key in intermediates:
                    path = paths.get(key)
                    paths[key] = loops if path is None else _common_prefix(path, loops)
            visit(block.body, loops)
            if block.init is not None:
                visit(block.init, loops)

    visit(root.body, [])
    return frozenset(loop for path in paths.values() for loop in path[:-1])


def _common_prefix(a: list, b: list) -> list:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def _full_tile_guard(body, defined: set, analyzer, tested: tuple = ()):
    """``(tests, {block realize: predicate terms left}, empty)``: the tests that, all true,
    make the predicate terms of the blocks in ``body`` they cover hold at every iteration of
    the loops inside ``body``; ``([], {}, None)`` when they cover none. A test among
    ``tested`` (made around ``body`` already) covers nothing here. ``empty``: a condition
    under which no block in ``body`` runs at all (one covered term false at every inner
    iteration of every block: the chunks of a partial tile wholly past ``n``), or None.

    A term is covered when its upper bound over the loops inside is expressible in the
    variables defined outside, and it varies only with inner loops of constant extent: a
    term over a loop of symbolic extent (a chunk index up to ``ceil(n / 16)``) holds for
    all chunks only when the tile divides ``n``, so it is left to that loop's own body."""
    terms, bounded = [], {}
    # per block, the conditions under which it never runs; ``body`` is empty under one they
    # all share (a block without a predicate always runs: then nothing is shared)
    never: list[list] | None = [] if _all_blocks_predicated(body) else None
    for realize, loops in _predicated_blocks(body, []):
        dom = {loop.loop_var: tvm.sym.IntervalSet(loop.min, loop.min + loop.extent - 1)
               for loop in loops}
        symbolic_loops = {_identity(loop.loop_var) for loop in loops
                          if not isinstance(loop.extent, tirx.IntImm)}
        left, dead = [], []
        all_terms = _conjuncts(realize.predicate)
        for term in all_terms:
            diff = _as_negative(term)  # term holds iff diff < 0
            bound = None
            if diff is not None and not any(_identity(v) in symbolic_loops
                                            for v in _vars_in(diff)):
                span = analyzer.int_set(diff, dom)
                bound, low = span.max_value, span.min_value
                if not all(_identity(v) in defined for v in _vars_in(bound)):
                    bound = None  # infinite, or depends on the loops inside
                elif all(_identity(v) in defined for v in _vars_in(low)):
                    dead.append(analyzer.simplify(low >= tirx.IntImm(str(low.ty), 0)))
            if bound is None:
                left.append(term)
                continue
            test = analyzer.simplify(bound < tirx.IntImm(str(bound.ty), 0))
            if any(tvm_ffi.structural_equal(test, t) for t in tested):
                left.append(term)  # false here, or it would have been stripped
                continue
            if not any(tvm_ffi.structural_equal(test, t) for t in terms):
                terms.append(test)
        if len(left) < len(all_terms):
            bounded[_identity(realize)] = left
        if never is not None:
            never.append(dead)
    if not terms:
        return [], {}, None
    shared = [c for c in never[0] if all(any(tvm_ffi.structural_equal(c, d) for d in other)
                                          for other in never[1:])] if never else []
    return terms, bounded, (shared[0] if shared else None)


def _all_blocks_predicated(stmt) -> bool:
    """Whether every block under ``stmt`` (but the root) has a predicate."""
    realizes: list = []
    tvm_ffi.structural_walk(stmt, [(SBlockRealize, realizes.append)])
    return bool(realizes) and all(not _is_true(r.predicate) for r in realizes)


def _predicated_blocks(stmt, loops: list) -> list:
    """``(realize, enclosing loops inside stmt)`` of every block with a predicate."""
    out = []
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            out += _predicated_blocks(s, loops)
    elif isinstance(stmt, tirx.For):
        out += _predicated_blocks(stmt.body, loops + [stmt])
    elif isinstance(stmt, tirx.IfThenElse):
        out += _predicated_blocks(stmt.then_case, loops)
        if stmt.else_case is not None:
            out += _predicated_blocks(stmt.else_case, loops)
    elif isinstance(stmt, SBlockRealize):
        if not _is_true(stmt.predicate):
            out.append((stmt, loops))
        out += _predicated_blocks(stmt.block.body, loops)
        if stmt.block.init is not None:
            out += _predicated_blocks(stmt.block.init, loops)
    return out


def _strip_predicates(stmt, bounded: dict):
    """``stmt`` with the predicates of the blocks in ``bounded`` replaced by what is left
    of them (their unbounded terms)."""
    if isinstance(stmt, tirx.SeqStmt):
        return tirx.SeqStmt([_strip_predicates(s, bounded) for s in stmt.seq])
    if isinstance(stmt, tirx.For):
        return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind,
                        _strip_predicates(stmt.body, bounded), stmt.thread_binding,
                        stmt.annotations)
    if isinstance(stmt, tirx.IfThenElse):
        return tirx.IfThenElse(stmt.condition, _strip_predicates(stmt.then_case, bounded),
                               None if stmt.else_case is None else
                               _strip_predicates(stmt.else_case, bounded))
    if isinstance(stmt, SBlockRealize):
        block = stmt.block
        block = _rebuild_block(block, body=_strip_predicates(block.body, bounded),
                               init=None if block.init is None else
                               _strip_predicates(block.init, bounded))
        predicate = stmt.predicate
        if _identity(stmt) in bounded:
            left = bounded[_identity(stmt)]
            predicate = tirx.const(True, "bool")
            for term in left:
                predicate = term if _is_true(predicate) else tirx.And(predicate, term)
        return SBlockRealize(stmt.iter_values, predicate, block)
    return stmt


def _rebuild_block(block, body, init=None):
    return SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, body,
                  init if init is not None else block.init, block.alloc_buffers,
                  block.match_buffers, block.annotations)


def _conjuncts(expr) -> list:
    if isinstance(expr, tirx.And):
        return _conjuncts(expr.a) + _conjuncts(expr.b)
    return [expr]


def _as_negative(term):
    """An expression ``d`` with ``term`` true iff ``d < 0``, or None."""
    if isinstance(term, tirx.LT):
        return term.a - term.b
    if isinstance(term, tirx.LE):
        return term.a - term.b - 1
    if isinstance(term, tirx.GT):
        return term.b - term.a
    if isinstance(term, tirx.GE):
        return term.b - term.a - 1
    return None


def _is_true(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 1
