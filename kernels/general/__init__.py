"""The general kernel family — every format's decode, the only Triton path of N:M binary, multi-plane binary
and PB-LLM weights: Triton source (:mod:`.jit`) and launches (:mod:`.launch`)."""
