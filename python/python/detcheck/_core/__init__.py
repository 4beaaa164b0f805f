"""The engine and its contract, framework-free: the recorder contract (``contract``), the
recording engine (``engine``), a zero-change recorder's life (``lifecycle``), the evidence of
causes (``evidence``), the writer's array normaliser (``arrays``), ``seed_all``'s settings
(``settings``) and ``detcheck.check``/``compare`` (``api``). Imports no framework at import
time and nothing of the package's folders above it (tests/tidy.rs, ``PYTHON_LAYERS``).
"""
