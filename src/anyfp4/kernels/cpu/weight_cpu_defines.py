"""The prepack layout as C defines for ``cpu/weight_cpu.c``: the tile constants and, from the formats' bit tables
(``packing.nvfp4.CODE_BITS``, ``packing.fp8.BYTE_BITS``), C expressions of shifts, rotates, masks and bit selects
that take a code, a value or a pair of them out of a 32-bit word; for the bf16 dot-product paths the pairing of a
word's values that takes the fewest operations. The packing modules stay the layout's only owner."""

from __future__ import annotations

import functools

from ...packing.fp8 import BYTE_BITS
from ...packing.layout import TILE_BLOCKS, TILE_ROWS, TILE_WORDS, WORDS_PER_BLOCK
from ...packing.nvfp4 import CODE_BITS


def _field_expression(bits: tuple[int, ...]) -> str:
    """A C expression of SRL / SHL / AND / OR moving word bits ``bits[b]`` to bit b (runs of consecutive
    positions move together)."""
    parts, b = [], 0
    while b < len(bits):
        run = 1
        while b + run < len(bits) and bits[b + run] == bits[b] + run:
            run += 1
        parts.append(f"SHL(AND(SRL(w,{bits[b]}),{(1 << run) - 1}),{b})")
        b += run
    expr = parts[0]
    for part in parts[1:]:
        expr = f"OR({expr},{part})"
    return expr


def _select_expression(bits: dict[int, int], exact: bool) -> str:
    """A C expression of SRL / SHL, AND and SEL(a, b, mask) (mask's bits from b, the rest from a) with word bit
    ``bits[t]`` at bit t for each target bit t (runs of consecutive positions move together). ``exact``: every
    other bit 0; else the other bits are anything (a permute's table index reads only its low bits). Fewer
    operations than ``_field_expression``'s shift / and / shift / or per run."""
    targets = sorted(bits)
    expr, i = None, 0
    while i < len(targets):
        run = 1
        while i + run < len(targets) and targets[i + run] == targets[i] + run and \
                bits[targets[i + run]] == bits[targets[i]] + run:
            run += 1
        t = targets[i]
        shift = bits[t] - t
        moved = f"SRL(w,{shift})" if shift > 0 else f"SHL(w,{-shift})" if shift < 0 else "w"
        mask = ((1 << run) - 1) << t
        if expr is None:
            expr = f"AND({moved},{mask})" if exact else moved
        else:
            expr = f"SEL({expr},{moved},{mask})"
        i += run
    return expr


def _rotation_expression(bits: dict[int, int], exact: bool = False) -> str:
    """A C expression of ROTL (rotate left), SRL / SHL, SEL and AND with word bit ``bits[t]`` at bit t for each target
    bit t: one rotation for all targets that move by the same amount (none for those that stay), merged by bit
    selects; a plain shift where all of them move the same way (on Zen 4 a rotate takes a dot product's or an FMA's
    slot, a shift does not); ``exact``: every other bit 0 (one AND at the end), else anything."""
    groups: dict[int, int] = {}
    ways: dict[int, set[bool]] = {}
    for t, src in bits.items():
        groups[(t - src) % 32] = groups.get((t - src) % 32, 0) | 1 << t
        ways.setdefault((t - src) % 32, set()).add(t >= src)
    expr = None
    for r in sorted(groups, key=lambda r: (r != 0, r)):  # the word as it is first (no operation)
        if r == 0:
            moved = "w"
        elif ways[r] == {True}:
            moved = f"SHL(w,{r})"
        elif ways[r] == {False}:
            moved = f"SRL(w,{32 - r})"
        else:
            moved = f"ROTL(w,{r})"
        expr = moved if expr is None else f"SEL({expr},{moved},{groups[r]})"
    return f"AND({expr},{sum(groups.values())})" if exact else expr


def _pair_index(a: int, b: int) -> dict[int, int]:
    """Target bits of a 16-bit-lane permute's two indices: code a's bits at 0..3, code b's at 16..19."""
    return {**{t: CODE_BITS[a][t] for t in range(4)}, **{16 + t: CODE_BITS[b][t] for t in range(4)}}


def _expression_cost(expr: str) -> int:
    """Operations: one per move (a rotation or shift), bit select and mask."""
    return sum(expr.count(op) for op in ("ROTL", "SRL", "SHL", "SEL", "AND"))


def _fp8_pair_bits(a: int, b: int) -> dict[int, int]:
    """Target bits of two E4M3 values as a bf16 pair read as ``e4m3 * 2^-120``: value a's 7 magnitude bits at 4..10
    and sign at 15, value b's at 20..26 and 31."""
    return {**{4 + i: BYTE_BITS[a][i] for i in range(7)}, 15: BYTE_BITS[a][7],
            **{20 + i: BYTE_BITS[b][i] for i in range(7)}, 31: BYTE_BITS[b][7]}


def _pairings(values: tuple[int, ...]):
    """Every split of ``values`` into ordered pairs."""
    if not values:
        yield ()
        return
    for i in range(1, len(values)):
        rest = values[1:i] + values[i + 1:]
        for tail in _pairings(rest):
            yield ((values[0], values[i]), *tail)
            yield ((values[i], values[0]), *tail)


@functools.lru_cache(maxsize=1)
def fp8_byte_pairs() -> tuple[tuple[int, int], ...]:
    """The two (first, second) value pairs of an FP8 word whose bf16 pair bits take the fewest operations."""
    return min(_pairings(tuple(range(len(BYTE_BITS)))),
               key=lambda ps: sum(_expression_cost(_rotation_expression(_fp8_pair_bits(*p), True)) for p in ps))


@functools.lru_cache(maxsize=1)
def nvfp4_code_pairs() -> tuple[tuple[int, int], ...]:
    """The four (first, second) code pairs of a word whose pair indices take the fewest operations (every pairing
    and order tried): the bf16 dot-product path decodes and multiplies a word's codes two at a time."""
    return min(_pairings(tuple(range(len(CODE_BITS)))),
               key=lambda ps: sum(_expression_cost(_rotation_expression(_pair_index(*p))) for p in ps))


def layout_defines() -> list[str]:
    """The compiler's -D flags: the layout's constants and every bit expression weight_cpu.c uses."""
    defines = [f"-DTILE_ROWS={TILE_ROWS}", f"-DTILE_WORDS={TILE_WORDS}", f"-DTILE_BLOCKS={TILE_BLOCKS}",
               f"-DWORDS_PER_BLOCK={WORDS_PER_BLOCK}"]
    defines += [f"-DNVFP4_CODE_{i}(w)={_field_expression(bits)}" for i, bits in enumerate(CODE_BITS)]
    defines += [f"-DNVFP4_INDEX_{i}(w)={_select_expression(dict(enumerate(bits)), exact=False)}"
                for i, bits in enumerate(CODE_BITS)]
    pairs = nvfp4_code_pairs()
    defines += [f"-DNVFP4_PAIR_INDEX_{p}(w)={_rotation_expression(_pair_index(a, b))}"
                for p, (a, b) in enumerate(pairs)]
    defines += ["-DNVFP4_PAIR_CODES={" + ",".join(str(c) for pair in pairs for c in pair) + "}"]
    fp8_pairs = fp8_byte_pairs()
    defines += [f"-DFP8_PAIR_BITS_{p}(w)={_rotation_expression(_fp8_pair_bits(a, b), True)}"
                for p, (a, b) in enumerate(fp8_pairs)]
    defines += ["-DFP8_PAIR_BYTES={" + ",".join(str(c) for pair in fp8_pairs for c in pair) + "}"]
    # an E4M3 value's magnitude at fp16 bits 7-13 and its sign at 15, the rest 0
    defines += [f"-DFP8_HALF_{i}(w)={_select_expression({**{7 + b: bits[b] for b in range(7)}, 15: bits[7]}, True)}"
                for i, bits in enumerate(BYTE_BITS)]
    defines += [f"-DFP8_MAGNITUDE_{i}(w)={_field_expression(bits[:7])}" for i, bits in enumerate(BYTE_BITS)]
    defines += [f"-DFP8_SIGN_{i}(w)={_field_expression(bits[7:])}" for i, bits in enumerate(BYTE_BITS)]
    return defines
