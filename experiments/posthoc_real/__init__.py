"""Post-hoc methods on a real pretrained Llama, SmolLM2-135M-Instruct (``docs/results/posthoc-real/``): the
rows (``run``), their report (``report``), the per-block diagnosis (``blocks``), the QuantLM exports
(``exports``), the GGUF in llama.cpp (``llama_cpp``) and the served chat (``serve_chat``)."""
