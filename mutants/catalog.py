"""The catalogue of planted bugs for the mutation self-test (``mutants/run.py``).

Each mutant is one exact text replacement in one source file, the kind of slip a reviewer
would worry about: window edges, padding rows, tail tokens, chunk merges, atomics, the first
block of a coff=2 segment, bucket edges, summation order. ``expect`` names the gate that must
fail; a mutant that stays inside the contract (an ulp-level change the tolerances are meant to
absorb) sets ``in_contract`` to the reason instead, and the gate must then pass.

The gate-logic mutants (``cpu_test`` set) plant the slip in the gate itself: n/a counted as a
pass, the op check or G1 comparing a tensor with itself, swapped coverage arguments, an empty
zeros mask, zero prefill, an adapter's exit let through. A gate run on correct kernels still
passes under them, so each names the CPU test whose planted fault the expected gate must catch;
that test must fail in the mutated tree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str            # repository path
    find: str            # exact text, occurring exactly once in ``file``
    replace: str
    ratio: int           # which gate judges it: csagate run --ratio <ratio>
    expect: str          # the gate that must fail ("G1", "G2", "zeros", "coverage", ...)
    why: str             # the bug, in a few words
    in_contract: str = ""  # non-empty: the reason this change is within the contract
    # Non-empty: the mutant weakens the gate's own logic (gates/, the CLI's loading of an
    # implementation) and is judged on the CPU: this pytest node, which plants a fault the
    # expected gate must catch, must FAIL in the mutated tree (``mutants/run.py cpu``). A
    # gate run on correct kernels would not see such a mutant by its cases alone.
    cpu_test: str = ""
    # The known-answer self-test (``gates/selftest.py``) that must stop the verdict at run
    # time in the mutated tree: ``csagate run`` there exits 3 naming it (``mutants/run.py
    # cpu``), whatever implementation it judges.
    selftest: str = ""

    @property
    def judge(self) -> str:
        """Where the mutant is judged: "cpu" (a planted-fault test) or "gpu" (csagate run)."""
        return "cpu" if self.cpu_test else "gpu"


FWD, BWD, SMALL, DEV = ("kernels/r128_fwd.py", "kernels/r128_bwd.py", "kernels/small.py",
                        "kernels/device.py")
RUNNER, COVERAGE, IMPL = "gates/runner.py", "gates/coverage.py", "gates/implementation.py"
COMPARATORS, LIMITS, FUZZ = "gates/comparators.py", "gates/limits.py", "gates/fuzz.py"
FAULTS, IMPLS = "tests/test_gate_faults.py", "tests/test_impls.py"
CHECKS = "tests/test_gate_checks.py"

MUTANTS: tuple[Mutant, ...] = (
    # (Every mutant stays in bounds: a kernel that reads or writes outside its tensors faults the
# GPU, and the gate then reports "could not evaluate" (exit 3), not a contract failure.)
# --- ratio=128 forward ------------------------------------------------------------------
    Mutant("fwd-merge-drops-nan-chunk", FWD,
           "                if den_t != F32(0.0):",
           "                if den_t > F32(0.0):", 128, "G2",
           "the chunk merge skips a chunk whose partial is NaN (hides eager's NaN)"),
    Mutant("fwd-first-block-reads-previous-segment", FWD,
           "                live = live & (blk > 0)",
           "                live = live & ((blk > 0) | (tok0 >= RATIO))", 128, "G2",
           "coff=2: the first block of every segment but the first reads the previous "
           "segment's last tokens as its first half"),
    Mutant("fwd-own-half-reads-first-half-columns", FWD,
           "                cblk = col + self.ncols",
           "                cblk = col", 128, "G2",
           "coff=2: the own block's half of the window reads columns [0, d), not [d, 2d)"),
    Mutant("fwd-padding-row-reads-block-1", FWD,
           "            tok0 = I32(0)",
           "            tok0 = I32(RATIO)", 128, "G2",
           "capacity padding rows read tokens [128, 256) instead of [0, 128)"),
    Mutant("fast-exp-drops-log2e-low-part", DEV,
           "    y = fma_rn(x, F32(L2E_LO), mul_rn(x, F32(L2E_HI)))",
           "    y = mul_rn(x, F32(L2E_HI))", 128, "",
           "the fast exp forgets the low part of log2(e)",
           in_contract="a relative change of at most |x| * 1.3e-8 in exp (|x| < 60 here): "
                       "ulp-level in fp32, far below one bf16 step of the outputs"),
    # --- ratio=128 backward -----------------------------------------------------------------
    Mutant("bwd-merge-drops-last-chunk", BWD,
           "            for t in cutlass.range_constexpr(self.tchunks):\n"
           "                den = add_rn(den, sh.den_p[t, c])",
           "            for t in cutlass.range_constexpr(self.tchunks - 1):\n"
           "                den = add_rn(den, sh.den_p[t, c])", 128, "G2",
           "the den / S' merge over chunks stops one chunk short"),
    Mutant("bwd-tail-token-not-zeroed", BWD,
           "            for t in cutlass.range(first + RATIO + g.ty, self._segment_end(",
           "            for t in cutlass.range(first + RATIO + 1 + g.ty, self._segment_end(",
           128, "zeros", "zero class (a): the first tail token of a segment is left unwritten"),
    Mutant("bwd-last-block-first-half-not-zeroed", BWD,
           "                for t in cutlass.range(first + g.ty, first + RATIO, TCH):",
           "                for t in cutlass.range(first + g.ty, first + RATIO - 1, TCH):",
           128, "zeros",
           "zero class (b), coff=2: the last own token of a segment's last block is unwritten"),
    Mutant("bwd-dape-drops-a-row", BWD,
           "        rDApe[self._dape_slot(g, i)] = add_rn(rDApe[self._dape_slot(g, i)], ds)",
           "        rDApe[self._dape_slot(g, i)] = ds", 128, "G2",
           "a CTA's dAPE sum keeps only its last row (accumulation into the atomics lost)"),
    # --- shared device helpers ---------------------------------------------------------------
    Mutant("short-segments-not-zeroed", DEV,
           "        if mCuc[s + 1] == mCuc[s]:",
           "        if mCuc[s + 1] < mCuc[s]:", 128, "zeros",
           "zero class (c): segments shorter than ratio (and empty ones) are never zeroed"),
    Mutant("token-padding-first-token-skipped", DEV,
           "    for t in cutlass.range(first, n_tokens, step, unroll=unroll):",
           "    for t in cutlass.range(first + step, n_tokens, step, unroll=unroll):", 128,
           "zeros", "zero class (d): each thread's first token-capacity padding row is skipped"),
    Mutant("segment-search-misses-segment-starts", DEV,
           "            if block <= row:",
           "            if block < row:", 4, "G2",
           "ratio=4: the first row of every segment is taken for the previous segment"),
    # --- ratio=4 backward ------------------------------------------------------------------
    Mutant("r4-bwd-fused-sum", SMALL,
           "rS[k, e])\n                    rU[k, e] = tk\n"
           "                    dot = add_rn(dot, tk)",
           "rS[k, e])\n                    rU[k, e] = tk\n"
           "                    dot = fma_rn(mul_rn(go, rU[k]), rS[k], dot)", 4, "drift",
           "ratio=4: S summed with a fused multiply-add (another rounding order than torch)"),
    Mutant("r4-bwd-dape-keeps-last-row", SMALL,
           "            rG[k, e] = rG[k, e] + ds",
           "            rG[k, e] = ds", 4, "drift",
           "ratio=4: the per-CTA dAPE register sum keeps only the last row"),
    # --- the other small ratios (each leaves ratio 4 as it is: the drift check passes) -------
    Mutant("r2-fwd-first-block-reads-previous-segment", SMALL,
           "            if blk > 0:\n"
           "                for k in cutlass.range_constexpr(RATIO):\n"
           "                    _fwd_load(",
           "            if (blk > 0) | (tok0 >= (RATIO if RATIO == 2 else 1 << 30)):\n"
           "                for k in cutlass.range_constexpr(RATIO):\n"
           "                    _fwd_load(", 2, "G2",
           "ratio=2, coff=2: the forward's first block of every segment but the first reads the "
           "previous segment's last tokens as its first half"),
    Mutant("r8-ape-row-modulo-4", SMALL,
           "        return k - self.ratio, (self.d if k >= self.ratio else 0), k % self.ratio",
           "        return k - self.ratio, (self.d if k >= self.ratio else 0), k % 4", 8, "G2",
           "coff=2: the APE row of window position k taken mod 4 (the ratio-4 constant), not "
           "mod ratio"),
    Mutant("r16-bwd-previous-block-offset-4", SMALL,
           "                    put(k, tok0 - RATIO + k, col)",
           "                    put(k, tok0 - 4 + k, col)", 16,
           "G2", "coff=2: the backward reads and writes the previous block at tok0 - 4 (the "
           "ratio-4 offset) instead of tok0 - ratio"),
    Mutant("r32-bwd-reread-ape-own-half-columns", SMALL,
           "            av = cute.local_tile(mApe, (1, VEC), (self.window_slot(k)[2], cg)).load()",
           "            av = cute.local_tile(mApe, (1, VEC), (self.window_slot(k)[2], "
           "cg % self.groups)).load()", 32, "G2",
           "coff=2, ratio 32 (the APE re-read per row): the own half reads the APE of columns "
           "[0, d)"),
    Mutant("fwd-column-guard-rounds-down", SMALL,
           "        if col < self.d // self.vec:",
           "        if col < self.d // self.vec // self.threads * self.threads:", 4, "G2",
           "the forward's column guard rounds down to whole CTAs: the last, partial group of "
           "column threads is skipped (d = 65: column 64 never written; no table config has a "
           "partial CTA, r4/c1d65/ragged3 does)"),
    # --- the deterministic dAPE reduction (kernels/reduce.py; the split form) ---------------
    Mutant("reduce-split-drops-last-group", "kernels/reduce.py",
           "launch(mDApe2, n_parts, n_groups, n_groups, I32(0), zero_dape, False)",
           "launch(mDApe2, n_parts, n_groups - 1, n_groups, I32(0), zero_dape, False)", 8, "G2",
           "deterministic mode, split reduction: the second pass sums one stage row too few "
           "(the last group's slices never reach dAPE)"),
    Mutant("reduce-split-groups-round-down", "kernels/reduce.py",
           "(n_parts + n_groups - 1) // n_groups, n_parts, I32(1),",
           "n_parts // n_groups, n_parts, I32(1),", 4, "G2",
           "deterministic mode, split reduction: slices per group rounded down, so the slices "
           "past groups * per are never summed"),
    Mutant("div-by-skips-correction", DEV,
           "    return fma_rn(r, fma_rn(-y, q, x), q)",
           "    return q", 4, "drift",
           "small kernels: the shared-reciprocal division returns x * r without its remainder "
           "correction (not always the IEEE quotient)"),
    Mutant("div-guard-nan-quiet", SMALL,
           "lo = cute.arch.fmin(lo, ek, nan=True)",
           "lo = cute.arch.fmin(lo, ek)", 4, "",
           "small kernels: the division guard's min drops NaN, so a window with a NaN e_k takes "
           "the shared reciprocal",
           in_contract="den is NaN there, so the shared reciprocal and every quotient are NaN "
           "as the IEEE divisions are: the same NaN pattern (the bitwise rule treats NaN as "
           "equal to NaN)"),
    # --- dispatch tables and the case list ----------------------------------------------------
    Mutant("large-bucket-edge-moved", "kernels/schedule.py",
           "    if n_rows >= LARGE_NB_MIN and (coff, d) in FWD_LARGE:",
           "    if n_rows > LARGE_NB_MIN and (coff, d) in FWD_LARGE:", 128, "edges",
           "the forward large bucket starts at 1025 rows instead of 1024"),
    Mutant("large-bucket-case-deleted", "gates/cases.py",
           "    _union(1, 128, (131072,), \"N=1024: forward large bucket (two-phase)\"),\n",
           "", 128, "coverage",
           "the only case that reaches the c1d128 large-bucket kernels is deleted"),
    # --- the gate's own logic (judged on the CPU: cpu_test must fail in the mutated tree) -----
    Mutant("na-counted-as-pass", RUNNER,
           '    return GateResult(gate, tensor, NA, {}, "n/a: the implementation provides no '
           'backward")',
           '    return GateResult(gate, tensor, PASS, {}, "n/a: the implementation provides no '
           'backward")', 128, "n/a",
           "a direction the implementation does not provide (no backward) is reported PASS, "
           "not n/a",
           cpu_test=f"{IMPLS}::test_forward_only_adapter_gets_na_for_the_backward",
           selftest="seam: a forward-only implementation's backward is n/a, never a pass"),
    Mutant("op-compares-op-output-with-itself", RUNNER,
           "comparators.bitwise_replay([direct, got],",
           "comparators.bitwise_replay([got, got],", 128, "op",
           "the op check compares each op output with itself (an op that swaps dKV and dScore "
           "passes)",
           cpu_test=f"{FAULTS}::test_an_op_that_swaps_dkv_and_dscore_fails_op",
           selftest="op check: an op that swaps dKV and dScore fails"),
    Mutant("op-storage-check-off", RUNNER,
           "    if a is b:\n        return True\n",
           "    return False\n", 128, "op",
           "the op check's distinct-storage test always says distinct (an op handing back the "
           "direct path's own buffers compares them with themselves)",
           cpu_test=f"{FAULTS}::test_an_op_that_returns_the_direct_paths_buffers_fails_op",
           selftest="op check: an op that hands back the direct path's buffers fails"),
    Mutant("coverage-missing-arguments-swapped", COVERAGE,
           "    missing = _minus(want, got)",
           "    missing = _minus(got, want)", 128, "coverage",
           "the table coverage subtracts the table from the selections instead of the "
           "selections from the table (a table kernel no case reaches goes unreported)",
           cpu_test=f"{FAULTS}::test_an_entry_no_case_reaches_fails_table_coverage_alone",
           selftest="coverage: an entry no case reaches fails; a stray kernel of a table config "
                    "fails"),
    Mutant("coverage-beyond-takes-table-configs", COVERAGE,
           "if configs and kernel_config(k) is not None and kernel_config(k) not in configs)",
           "if configs and kernel_config(k) is not None)", 128, "coverage",
           "every selected kernel outside the table entries counts as beyond the configs (a "
           "stray kernel of a table config is no longer unexpected)",
           cpu_test=f"{FAULTS}::test_a_case_beyond_the_contracts_configs_does_not_fail_coverage",
           selftest="coverage: an entry no case reaches fails; a stray kernel of a table config "
                    "fails"),
    Mutant("g1-compares-run-1-with-itself", RUNNER,
           "            self.replay[name].add(t)",
           "            self.replay[name].add(self.first[name])", 128, "G1",
           "G1 replays run 1 against itself: a run-to-run difference is never seen",
           cpu_test=f"{FAULTS}::test_nondeterministic_output_fails_g1",
           selftest="seam: a run-to-run difference fails G1"),
    Mutant("zeros-mask-all-false", RUNNER,
           "n_tokens=pack.n_tokens, tokens=(start, end))\n",
           "n_tokens=pack.n_tokens, tokens=(start, end)) & False\n", 128, "zeros",
           "the zeros gate is given an all-False never-consumed mask (checks no slot)",
           cpu_test=f"{FAULTS}::test_a_never_consumed_slot_left_tiny_fails_zeros_alone",
           selftest="seam: a never-consumed slot left at 2^-100 fails zeros"),
    Mutant("nan-prefill-becomes-zero-prefill", RUNNER,
           "    return 0.0 if run == 0 else math.nan",
           "    return 0.0", 128, "G1",
           "runs 2 and 3 are zero-filled like run 1: a slot the kernel never writes looks like "
           "an exact zero",
           cpu_test=f"{FAULTS}::test_unwritten_never_consumed_slot_fails_g1_and_zeros",
           selftest="seam: a never-consumed slot left unwritten fails zeros and G1"),
    Mutant("adapter-exit-not-caught", IMPL,
           "    except BaseException as exc:  # SystemExit and KeyboardInterrupt on purpose",
           "    except Exception as exc:  # SystemExit and KeyboardInterrupt on purpose", 128,
           "exit 2",
           "loading an --impl adapter catches Exception only: its sys.exit(0) on import ends "
           "csagate run with exit 0 and no verdict",
           cpu_test=f"{IMPLS}::test_an_adapter_that_exits_on_import_is_a_usage_error",
           selftest="loading: an adapter that exits while loading is refused, not obeyed"),
    # --- the gate's checking machinery, each stopped at run time by a self-test ---------------
    Mutant("bitwise-compares-values", COMPARATORS,
           "    differs = (bit_view(fused) != bit_view(ref)) & ~both_nan & judged",
           "    differs = (fused != ref) & ~both_nan & judged", 4, "G2",
           "the bitwise comparator compares values: -0.0 equals +0.0 again",
           cpu_test=f"{CHECKS}::test_bitwise_compares_bit_patterns",
           selftest="bitwise: -0 is not +0"),
    Mutant("allowance-without-the-log", LIMITS,
           "    limit = math.log(1 / alpha)",
           "    limit = 1 / alpha", 128, "G2",
           "the count allowance takes 1/alpha for ln(1/alpha): every element may differ",
           cpu_test=f"{CHECKS}::test_count_rule_informative_only_where_it_can_fail",
           selftest="count allowance: sound and tight against the exact binomial tail"),
    Mutant("judged-check-reported-inconclusive", RUNNER,
           '        if status == PASS and getattr(check, "numel", None) == 0:',
           '        if status == PASS and getattr(check, "numel", None) is not None:', 128,
           "G2", "a passing check that judged its elements is reported inconclusive",
           cpu_test=f"{FAULTS}::test_unfaulted_backend_passes",
           selftest="records: a check is inconclusive on empty input only"),
    Mutant("seam-drops-the-bitwise-claim", "gates/plugin.py",
           '                   bitwise=tuple(getattr(impl, "bitwise", None) or ()))',
           '                   bitwise=())', 4, "G2",
           "the plug-in seam drops an implementation's bitwise claim: it is never held to it",
           cpu_test="tests/test_inference_impls.py::"
                    "test_a_broken_bitwise_claim_fails_the_gate_and_names_its_rows",
           selftest="seam: a claimed bitwise output is held to its claim"),
    Mutant("case-file-drops-pad-rows", "gates/casefile.py",
           "    values = {name: _check_field(name, value) for name, value in doc.items()}",
           "    values = {name: _check_field(name, value) for name, value in doc.items()\n"
           "              if name != \"pad_rows\"}", 4, "G2",
           "run --case-file reads a case file without its pad_rows (the replay is another "
           "pack)",
           cpu_test="tests/test_casefile.py::test_a_case_round_trips",
           selftest="case file: written and read back equal, field by field"),
    Mutant("shrinker-takes-a-passing-step", FUZZ,
           "                if fails(got) and signature(got) & target:",
           "                if {g.gate for g in got.gates} & target:", 4, "G2",
           "the shrinker keeps a candidate that no longer fails (it has the gate, passing)",
           cpu_test="tests/test_fuzz.py::"
                    "test_shrink_keeps_a_short_segment_and_drops_everything_else",
           selftest="shrinker: a candidate that passes is never taken; one that fails is"),
    Mutant("parity-passes-a-non-finite-reference", COMPARATORS,
           '    ok = err_fused <= bound and err_eager != float("inf")',
           "    ok = err_fused <= bound", 128, "G3",
           "G3 passes where the reference's own error is infinite (the bound means nothing)",
           cpu_test=f"{CHECKS}::test_oracle_parity_non_finite_fails",
           selftest="G3 parity: at the bound passes, beyond fails, a non-finite reference error "
                    "fails"),
    Mutant("nan-mask-full-not-required", COMPARATORS,
           "        ok=n_mismatch == 0 and (eager_full or not require_full))",
           "        ok=n_mismatch == 0)", 128, "G2",
           "the overflow case's G2 no longer requires eager's NaN mask to be full",
           cpu_test=f"{CHECKS}::test_nan_mask_requires_a_full_eager_mask",
           selftest="NaN mask: equal masks pass, a moved NaN fails, a partial mask fails when "
                    "full is due"),
    Mutant("zero-class-b-dropped", "reference/compressor.py",
           "            mark(start + (nb - 1) * ratio, start + nb * ratio, d)",
           "            pass", 4, "zeros",
           "the never-consumed mask forgets class (b): the last block's own tokens in columns "
           "[0, d) are never checked for zeros",
           cpu_test="tests/test_reference.py::test_zero_classes_are_exact_zeros",
           selftest="zero classes: the never-consumed mask of a hand-built pack"),
    Mutant("reference-ape-row-off-by-one", "reference/compressor.py",
           "ape3[slots.ape_row, slots.half][:, None, :]",
           "ape3[(slots.ape_row + 1) % ape3.shape[0], slots.half][:, None, :]", 4, "drift",
           "the references read APE row k + 1 for window position k (fp32 and fp64 alike, so "
           "G3 alone cannot see it)",
           cpu_test="tests/test_reference.py::test_oracle_agrees_with_its_scalar_derivation",
           selftest="oracle: the fp64 oracle agrees with its scalar derivation"),
)
