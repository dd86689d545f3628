"""The affine kernel family — ternary, binary and int2/3/4 weights: Triton source (:mod:`.jit`), launch plans
(:mod:`.plan`) and their tuned configs (:mod:`.tuning`)."""
