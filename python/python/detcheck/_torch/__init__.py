"""The PyTorch front end, a plugin of the recorder contract (``detcheck._core.contract``):
its tensors (``subclasses``, ``tensors``), the front end (``frontend``), device digests
(``device``, ``device_records``), the operator trace (``ops``), the batch checks (``batch``,
``rows``) and the zero-change recorder (``auto``). Imports ``_core`` and the native module,
never another framework's folder (tests/tidy.rs).
"""
